"""The summarizer seam: what turns a slice of history into a compaction summary.

Chosen per profile (AgentProfile.summarizer):

- "role": one utility request to the session's compactor model role
  (runtime.models.resolve_spec("compactor", ...)) over the rendered history.
  Raises SummarizerNotConfigured when the role resolves to nothing and
  SummarizerFailed when the model call fails.
- "morph": Morph's Compact API over httpx. It never raises for the provider's
  sake: no key, an HTTP error or a torn/malformed response is logged as a
  warning and it returns None (the compaction declines; the next overweight
  turn tries again).

Both return the utility request's own usage so the caller records it as
usage/recorded and session cost stays complete.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from django.conf import settings

from sessions_app.errors import SummarizerFailed, SummarizerNotConfigured
from sessions_app.llm.registry import complete_utility
from sessions_app.llm.types import ModelError, Usage
from sessions_app.log.projection import SUMMARY_PREFIX
from sessions_app.models import AgentProfile
from sessions_app.runtime.roles import resolve_spec

log = logging.getLogger(__name__)

MORPH_MODEL = "morph-compactor"
MORPH_COMPRESSION_RATIO = 0.5
MORPH_TIMEOUT_SECONDS = 60.0

SUMMARY_SYSTEM_PROMPT = (
    "You summarize an agent's conversation so it can continue without the full history. "
    "The history below has one role-tagged line per message part; tool calls and tool results are included. "
    "Write a concise summary of the conversation so far: the user's goals and requests, decisions made, "
    "facts learned, tool calls made and what they returned (file paths, values, errors), and anything "
    "still open. Write it as plain text, in the third person, without preamble."
)


@dataclass(frozen=True)
class HistoryEvent:
    seq: int
    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class History:
    """The model-visible slice being compacted: the latest compaction (if any)
    followed by every model-visible event after it, up to `head`."""

    session_id: uuid.UUID
    head: int
    events: list[HistoryEvent] = field(default_factory=list)


@dataclass(frozen=True)
class Summary:
    text: str
    model: str
    usage: Usage | None


class Summarizer(Protocol):
    name: str

    def summarize(self, history: History) -> Summary | None: ...


# ---------------------------------------------------------------- rendering


def _tagged(tag: str, text: str | None) -> str:
    # One role-tagged line per part; continuation lines of a multi-line part
    # are indented so they can never be read as a tag of their own.
    body = (text or "").replace("\r\n", "\n").replace("\n", "\n  ")
    return f"[{tag}] {body}"


def render_parts(event: HistoryEvent) -> list[str]:
    """The role-tagged lines of one model-visible event."""
    kind, data = event.kind, event.data
    if kind == "session/compacted":
        return [_tagged("summary of earlier conversation", data["summary"])]
    if kind in ("user/message", "context/injected"):
        return [_tagged("user", data["text"])]
    if kind == "assistant/message":
        lines = [_tagged("assistant", data["content"])] if data.get("content") else []
        for call in data.get("tool_calls") or []:
            lines.append(_tagged(f"assistant tool call {call['id']}", f"{call['name']} {call['arguments'] or '{}'}"))
        return lines
    if kind == "tool/result":
        status = "error" if data.get("is_error") else "ok"
        return [_tagged(f"tool result {data['call_id']} {data['name']} {status}", data["content"])]
    return []


def render_history(history: History) -> str:
    return "\n".join(line for event in history.events for line in render_parts(event))


def role_messages(history: History) -> list[dict[str, str]]:
    """One {role, content} message per event, tool calls and results written
    into the content (Morph takes plain role/content pairs)."""
    out: list[dict[str, str]] = []
    for event in history.events:
        lines = render_parts(event)
        if not lines:
            continue
        role = {
            "session/compacted": "user",
            "user/message": "user",
            "context/injected": "user",
            "assistant/message": "assistant",
            "tool/result": "tool",
        }[event.kind]
        if event.kind == "session/compacted":
            content = SUMMARY_PREFIX + event.data["summary"]
        elif event.kind in ("user/message", "context/injected"):
            content = event.data["text"]
        else:
            content = "\n".join(lines)
        out.append({"role": role, "content": content})
    return out


# ---------------------------------------------------------------- role summarizer


class RoleSummarizer:
    """One utility request with the compactor model role."""

    name = "role"

    def __init__(self, profile: AgentProfile | None, session_id: uuid.UUID | str | None) -> None:
        self.profile = profile
        self.session_id = session_id

    def spec(self) -> str:
        spec = resolve_spec("compactor", self.profile, self.session_id)
        if not spec:
            raise SummarizerNotConfigured(
                "no compactor model is configured: set the profile's compactor role or TERRET_MODEL_COMPACTOR"
            )
        return spec

    def summarize(self, history: History) -> Summary:
        spec = self.spec()
        messages = [
            {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
            {"role": "user", "content": render_history(history)},
        ]
        try:
            reply = complete_utility(spec, messages)
        except ModelError as exc:
            raise SummarizerFailed(f"the compactor model {spec} failed: {exc}") from exc
        return Summary((reply.content or "").strip(), spec, reply.usage)


# ---------------------------------------------------------------- morph


class MorphSummarizer:
    """Morph's Compact API: POST {MORPH_BASE_URL}/compact.

    Wire format from Morph's documentation of the native endpoint
    (docs.morphllm.com, "Compact" / API reference POST /v1/compact): request
    {"messages": [{role, content}], "query", "compression_ratio", "model":
    "morph-compactor", "include_markers", "include_line_ranges"} with a Bearer
    key; response {"id", "model", "output": "<compacted text>", "usage":
    {"input_tokens", "output_tokens", "compression_ratio", ...}}. Morph
    returns no price, so its usage is recorded as unpriced."""

    name = "morph"

    def __init__(self, *, api_key: str | None = None, base_url: str | None = None, timeout: float | None = None):
        self.api_key = settings.MORPH_API_KEY if api_key is None else api_key
        self.base_url = (base_url or settings.MORPH_BASE_URL or "").rstrip("/")
        self.timeout = MORPH_TIMEOUT_SECONDS if timeout is None else timeout

    def request_body(self, history: History) -> dict[str, Any]:
        messages = role_messages(history)
        body: dict[str, Any] = {
            "model": MORPH_MODEL,
            "messages": messages,
            "compression_ratio": MORPH_COMPRESSION_RATIO,
            "include_markers": True,
            "include_line_ranges": False,
        }
        query = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        if query:
            body["query"] = query[:2000]
        return body

    def summarize(self, history: History) -> Summary | None:
        if not self.api_key:
            log.warning("morph summarizer: MORPH_API_KEY is not set; compaction of %s declined", history.session_id)
            return None
        try:
            response = httpx.post(
                f"{self.base_url}/compact",
                json=self.request_body(history),
                headers={"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"},
                timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 15.0)),
            )
        except httpx.HTTPError as exc:  # connect/read timeouts, resets, a body cut short
            log.warning("morph summarizer: request failed (%s: %s); compaction declined", type(exc).__name__, exc)
            return None
        if response.status_code >= 400:
            log.warning("morph summarizer: HTTP %s %s; compaction declined", response.status_code, response.text[:200])
            return None
        return self._parse(response)

    def _parse(self, response: httpx.Response) -> Summary | None:
        try:
            payload = response.json()
        except ValueError:
            log.warning("morph summarizer: torn or non-JSON response %r; compaction declined", response.text[:80])
            return None
        output = payload.get("output") if isinstance(payload, dict) else None
        if not isinstance(output, str) or not output.strip():
            log.warning("morph summarizer: the response carries no output; compaction declined")
            return None
        model = f"morph/{payload.get('model') or MORPH_MODEL}"
        return Summary(output.strip(), model, _morph_usage(payload.get("usage")))


def _morph_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    try:
        prompt = int(raw.get("input_tokens", raw.get("prompt_tokens", 0)) or 0)
        completion = int(raw.get("output_tokens", raw.get("completion_tokens", 0)) or 0)
    except (TypeError, ValueError):
        return None
    cost = raw.get("cost")
    if not isinstance(cost, int | float) or isinstance(cost, bool) or cost < 0:
        cost = None  # Morph reports no price: unpriced, never $0
    return Usage(max(prompt, 0), max(completion, 0), None if cost is None else float(cost))


def get_summarizer(profile: AgentProfile | None, session_id: uuid.UUID | str | None = None) -> Summarizer:
    """The profile's summarizer (role unless the profile says morph)."""
    if profile is not None and profile.summarizer == "morph":
        return MorphSummarizer()
    return RoleSummarizer(profile, session_id)
