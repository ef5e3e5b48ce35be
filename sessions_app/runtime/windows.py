"""Context windows: what a model can take, and what a request would need.

A role's window is the one its profile declares (AgentProfile.context_windows)
or the one learned for its model from a provider's context-length error
(model/window, kept in ModelWindow for every session), the smaller of the
two when both are known. A request's size is estimated, not tokenized:
characters of its text over TERRET_CHARS_PER_TOKEN, which errs high for
prose (about 4 characters a token) and is near the mark for code and JSON.
What is left for the reply is TERRET_CONTEXT_RESERVE_TOKENS, or an eighth
of a small window.

A refusal that names no figures (a bare `context_length_exceeded`, some
proxies' wording) still teaches something: the window is smaller than the
refused request. after_refusal halves that request's estimate, and halves
again on the next refusal, down to TERRET_CONTEXT_FLOOR_TOKENS; below the
floor nothing is believed any more and the request is given up (the runner
blocks the turn `context_overflow`, the summarizer fails). A fixed guess
would not do: one too large is refused forever.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings

from sessions_app.llm.types import ToolSpec
from sessions_app.models import AgentProfile, ModelWindow

# A learned window is read again after this long (another process may have
# learned a smaller one); until then this process's copy serves every step.
LEARNED_TTL_SECONDS = 60.0
_MESSAGE_OVERHEAD_TOKENS = 4

_learned: dict[str, tuple[int | None, float]] = {}
_lock = threading.Lock()


def declared(profile: AgentProfile | None, role: str) -> int | None:
    value = (getattr(profile, "context_windows", None) or {}).get(role)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def learned(spec: str) -> int | None:
    now = time.monotonic()
    with _lock:
        hit = _learned.get(spec)
    if hit is not None and now - hit[1] < LEARNED_TTL_SECONDS:
        return hit[0]
    tokens = ModelWindow.objects.filter(spec=spec).values_list("tokens", flat=True).first()
    with _lock:
        _learned[spec] = (tokens, now)
    return tokens


def remember(spec: str, tokens: int) -> None:
    """This process learned `spec`'s window itself (its event is committed)."""
    with _lock:
        _learned[spec] = (tokens, time.monotonic())


def forget() -> None:
    """Drop this process's copies of learned windows (they are read again)."""
    with _lock:
        _learned.clear()


def window_for(profile: AgentProfile | None, role: str, spec: str) -> int | None:
    found = [w for w in (declared(profile, role), learned(spec) if spec else None) if w]
    return min(found) if found else None


def reserve(window: int) -> int:
    return min(settings.TERRET_CONTEXT_RESERVE_TOKENS, window // 8)


def estimate_tokens(messages: list[dict[str, Any]], tools: list[ToolSpec] | None = None) -> int:
    chars = 0
    for m in messages:
        chars += len(m.get("content") or "")
        for call in m.get("tool_calls") or []:
            chars += len(call["function"]["name"]) + len(call["function"]["arguments"] or "")
    for tool in tools or []:
        chars += len(tool.name) + len(tool.description) + len(str(tool.parameters))
    return int(chars / settings.TERRET_CHARS_PER_TOKEN) + _MESSAGE_OVERHEAD_TOKENS * len(messages)


def fits(tokens: int, window: int) -> bool:
    return tokens <= window - reserve(window)


def halved(estimate: int) -> int | None:
    """The window to believe after a refusal of a request of `estimate`
    tokens that says nothing of the limit: half the request, at least the
    floor; None when the refused request was at or under the floor already."""
    floor = settings.TERRET_CONTEXT_FLOOR_TOKENS
    if estimate <= floor:
        return None
    return max(estimate // 2, floor)


def after_refusal(window: int | None, estimate: int, limit: int | None) -> int | None:
    """The window to believe after the provider refused, as too long, a
    request of `estimate` tokens (our estimate) while `window` was believed
    (None: none known). `limit`: the one the provider stated, if any. None:
    nothing smaller is believable (the floor is reached).

    A stated limit below what was believed is taken as it is. A request that
    was over the believed window is refused for that reason: the window
    stands (compacting to it is the remedy). Otherwise what was believed is
    wrong, or nothing was: the request's estimate halved (halved())."""
    if limit and (window is None or limit < window):
        return limit
    known = window or limit
    if known and not fits(estimate, known):
        return known
    return halved(estimate)
