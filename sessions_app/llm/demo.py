"""The offline demo model (`demo/offline`): deterministic, no network.

It exists so a fresh checkout without an API key still shows a working
agent: streaming text, a tool call, an approval for a mutating tool, and a
reply to the tool's result.

It honours an `Abort` between streamed words (a cancel in the chat shows the
same way as with a real model). It arms no deadline: it cannot hang.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sessions_app.llm.abort import Abort
from sessions_app.llm.deadline import stop_error
from sessions_app.llm.types import DeltaSink, ModelReply, ToolCall, ToolSpec, Usage

logger = logging.getLogger(__name__)

DEFAULT_DELAY_SECONDS = 0.02
_PREFIX = "(offline demo model)"
_SUMMARY_LIMIT = 200

# Keywords count only at the start of a message ("please", "can you" and the
# like may come first), so an ordinary sentence that happens to contain
# "list" or "time" is answered as text, not with a tool call.
_LEAD = r"^\s*(?:(?:please|can you|could you|now)[\s,]+)?"
_WRITE = re.compile(_LEAD + r"write\s+(?P<path>[^\s:]+)\s*:\s*(?P<content>.*)", re.IGNORECASE | re.DOTALL)
_READ = re.compile(_LEAD + r"read\s+(?:the\s+)?(?:file\s+)?(?P<path>[^\s]+)", re.IGNORECASE)
_TIME = re.compile(_LEAD + r"(?:what(?:'s|\s+is)?\s+(?:the\s+)?)?(?:time|clock)\b", re.IGNORECASE)
_LIST = re.compile(_LEAD + r"list\b", re.IGNORECASE)
_ANY_WRITE = re.compile(_LEAD + r"write\b", re.IGNORECASE)
# What a tool result says when the call never ran (runtime/calls.py):
# "denied: <reason>" for a reviewer's or a revoked session's no, "vetoed:
# <why>" for a policy's.
_REFUSED = re.compile(r"^\s*(denied|vetoed)\b:?\s*(?P<why>.*)", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class _Intent:
    tool: str
    arguments: dict[str, Any]


def _text(content: Any) -> str:
    """Message content as plain text (it may be a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _intent(text: str) -> _Intent | None:
    if m := _WRITE.search(text):
        return _Intent("workspace.write", {"path": m["path"], "content": m["content"].strip()})
    if m := _READ.search(text):
        return _Intent("workspace.read", {"path": m["path"].rstrip(".,;!?")})
    if _TIME.search(text):
        return _Intent("clock.now", {})
    if _LIST.search(text):
        return _Intent("workspace.list", {})
    if _ANY_WRITE.search(text):
        return _Intent("workspace.write", {"path": "demo-note.txt", "content": text.strip()})
    return None


def _system_text(messages: list[dict[str, Any]]) -> str:
    return " ".join(_text(m.get("content")) for m in messages if m.get("role") == "system").lower()


def _title(messages: list[dict[str, Any]]) -> str:
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    words = re.findall(r"[\w'-]+", users[0] if users else "")[:6]
    return " ".join(words).capitalize() or "Demo conversation"


def _summary(messages: list[dict[str, Any]]) -> str:
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    last = users[-1][:_SUMMARY_LIMIT] if users else "nothing yet"
    return f"{_PREFIX} {len(messages)} messages so far. The latest user request was: {last}"


def _tool_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """call id -> tool name, from the assistant messages that made the calls."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            names[call.get("id", "")] = call.get("function", {}).get("name", "a tool")
    return names


def _results_summary(messages: list[dict[str, Any]]) -> str:
    trailing: list[dict[str, Any]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        trailing.insert(0, message)
    names = _tool_names(messages)
    parts, ran = [], False
    for message in trailing:
        name = names.get(message.get("tool_call_id", ""), "the tool")
        result = _text(message.get("content")).strip()
        if len(result) > _SUMMARY_LIMIT:
            result = result[:_SUMMARY_LIMIT] + "..."
        if refused := _REFUSED.match(result):
            verdict, why = refused[1].lower(), refused["why"].strip()
            parts.append(f"{name} was {verdict}, so it did not run" + (f": {why}" if why else "."))
        else:
            ran = True
            parts.append(f"{name} returned: {result or '(nothing)'}")
    # "Done." only when something ran: after a denial or a veto it would be untrue.
    return f"{_PREFIX} " + ("Done. " if ran else "Nothing was done. ") + " ".join(parts)


def _user_reply(text: str, offered: set[str]) -> str | _Intent:
    intent = _intent(text)
    if intent is None:
        return (
            f"{_PREFIX} I am the built-in offline demo model, not a real LLM; set TERRET_LLM_API_KEY to use one. "
            f"Start a message with 'what time is it', 'list', 'read <path>' or 'write <path>: <text>' "
            f"(writing asks for approval). You said: {text.strip()}"
        )
    if intent.tool not in offered:
        return f"{_PREFIX} I would call `{intent.tool}`, but this agent does not have that tool."
    return intent


def _decide(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> str | _Intent:
    # Utility roles (titler, compactor) offer no tools; an agent's own system
    # prompt may well mention "title" without asking for one.
    system = "" if tools else _system_text(messages)
    if "title" in system:
        return _title(messages)
    if "summar" in system:
        return _summary(messages)
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return _results_summary(messages)
    if last.get("role") == "user":
        return _user_reply(_text(last.get("content")), {t.name for t in tools})
    return f"{_PREFIX} There is no new user message to answer."


def _words(text: str) -> Iterator[str]:
    yield from re.findall(r"\s*\S+\s*", text)


def _delay() -> float:
    raw = os.environ.get("TERRET_DEMO_DELAY", "")
    try:
        return max(0.0, float(raw)) if raw.strip() else DEFAULT_DELAY_SECONDS
    except ValueError:
        logger.warning("TERRET_DEMO_DELAY=%r is not a number; using %s", raw, DEFAULT_DELAY_SECONDS)
        return DEFAULT_DELAY_SECONDS


def _tokens(chars: int) -> int:
    return (chars + 3) // 4


def _prompt_chars(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> int:
    tool_chars = sum(len(t.name) + len(t.description) + len(json.dumps(t.parameters)) for t in tools)
    return sum(len(json.dumps(m, default=str)) for m in messages) + tool_chars


class DemoAdapter:
    """Picks a tool from a keyword at the start of the last user message; otherwise echoes."""

    def complete(
        self,
        spec: str,
        messages: list[dict[str, Any]],
        tools: list[ToolSpec],
        on_delta: DeltaSink | None = None,
        abort: Abort | None = None,
    ) -> ModelReply:
        if abort is not None and abort.is_set():
            raise stop_error(abort, spec, ModelReply(content=None))
        decision = _decide(messages, tools)
        prompt = _tokens(_prompt_chars(messages, tools))
        if isinstance(decision, _Intent):
            arguments = json.dumps(decision.arguments)
            call = ToolCall(id=f"demo_{secrets.token_hex(8)}", name=decision.tool, arguments=arguments)
            usage = Usage(prompt, _tokens(len(decision.tool) + len(arguments)), 0.0)
            return ModelReply(content=None, tool_calls=[call], usage=usage, finish_reason="tool_calls")
        self._stream(spec, decision, on_delta, abort)
        return ModelReply(content=decision, usage=Usage(prompt, _tokens(len(decision)), 0.0), finish_reason="stop")

    def _stream(self, spec: str, text: str, on_delta: DeltaSink | None, abort: Abort | None) -> None:
        if on_delta is None:
            return
        delay = _delay()
        sent: list[str] = []
        for word in _words(text):
            if abort is not None and abort.is_set():
                raise stop_error(abort, spec, ModelReply(content="".join(sent) or None))
            on_delta(word)
            sent.append(word)
            if not delay:
                continue
            if abort is not None:
                abort.wait(delay)  # returns at once on an abort
            else:
                time.sleep(delay)
