"""The context view: what the model will see on the session's next step.

The request's messages as the runner assembles them (runtime/request.py:
the profile's system prompt, or the default, then the projection of the log
after the latest compaction), and the tools the
profile offers with their approval mode, each with the runtime's own token
estimate (runtime/windows.py). Plus the model the main role resolves to, and
the models the picker offers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from approvals_app.gate import approval_mode, needs_approval
from sessions_app.llm.providers import providers, unreachable
from sessions_app.llm.types import DEMO_SPEC, ToolSpec
from sessions_app.log.projection import latest_compaction
from sessions_app.models import ModelTally, Session
from sessions_app.runtime import request, windows
from sessions_app.runtime.roles import resolve_spec
from sessions_app.tools.registry import build_registry

# Messages shown in full; longer ones are cut on the page (the estimate counts all of it).
SHOWN_CHARS = 4000
MODEL_OPTIONS = 30


@dataclass(frozen=True)
class ContextMessage:
    role: str
    text: str
    cut: bool
    tokens: int


@dataclass(frozen=True)
class ContextTool:
    name: str
    description: str
    mode: str  # never | policy | always
    asks: bool
    tokens: int


def _message_text(message: dict[str, Any]) -> str:
    parts = [str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        parts.append(f"→ {fn.get('name', '')}({fn.get('arguments', '')})")
    return "\n".join(p for p in parts if p)


def _tools(session: Session) -> tuple[list[ContextTool], list[ToolSpec], list[str]]:
    """The profile's built-in tools with their approval mode; MCP servers by
    name only (listing their tools means starting them)."""
    profile = session.profile
    if profile is None:
        return [], [], []
    overrides = profile.approvals or {}
    try:
        registry = build_registry(profile.builtin_tools or [], (), overrides)
    except ValueError:
        return [], [], []
    specs = registry.specs()
    tools = [
        ContextTool(
            d.name,
            d.description,
            approval_mode(d, overrides),
            needs_approval(d, overrides),
            windows.estimate_tokens([], [spec]),
        )
        for d, spec in zip(registry.values(), specs, strict=True)
    ]
    servers = [str(s.get("name", "?")) for s in (profile.mcp_servers or []) if isinstance(s, dict)]
    return tools, specs, servers


def model_choices(session: Session, current: str | None) -> list[str]:
    """Suggestions for the picker (any model name may be typed): the demo,
    the configured ones, and those this installation has used."""
    seen: list[str] = []
    profile_main = ((session.profile.roles or {}).get("main") if session.profile else None) or ""
    used = ModelTally.objects.order_by().values_list("model", flat=True).distinct()[:MODEL_OPTIONS]
    for spec in [current or "", profile_main, settings.TERRET_MODEL_MAIN, DEMO_SPEC, *used]:
        if spec and spec not in seen:
            seen.append(spec)
    return seen


def context_view(session: Session) -> dict[str, Any]:
    profile = session.profile
    messages = request.build(session.id, profile)
    shown = [
        ContextMessage(
            m["role"],
            (text := _message_text(m))[:SHOWN_CHARS],
            len(text) > SHOWN_CHARS,
            windows.estimate_tokens([m]),
        )
        for m in messages
    ]
    tools, specs, servers = _tools(session)
    model = resolve_spec("main", profile, overrides={"main": session.model_main}) or ""
    compaction = latest_compaction(session.id)
    total = windows.estimate_tokens(messages, specs)
    window = windows.window_for(profile, "main", model) if model else None
    return {
        "ctx_messages": shown,
        "ctx_tools": tools,
        "ctx_servers": servers,
        "ctx_model": model,
        "ctx_model_override": session.model_main,
        "ctx_choices": model_choices(session, model),
        # Said before a turn fails on it: the picker refuses such a model too (actions.set_model).
        "ctx_unreachable": unreachable(model) if model else None,
        "ctx_providers": providers(),
        "ctx_total": total,
        "ctx_window": window,
        "ctx_compacted_seq": compaction[0] if compaction else None,
        "chars_per_token": settings.TERRET_CHARS_PER_TOKEN,
    }
