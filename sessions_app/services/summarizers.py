"""The summarizer seam: what turns a slice of history into a compaction summary.

Chosen per profile (AgentProfile.summarizer):

- "role": utility requests to the session's compactor model role
  (runtime.roles.resolve_spec("compactor", ...)) over the rendered history,
  as many as its context window needs (below). Raises SummarizerNotConfigured
  when the role resolves to nothing and SummarizerFailed when a model call
  fails or the history cannot be brought within the window.
- "morph": Morph's Compact API over httpx, given input cut to fit its limit
  (below). It never raises for the provider's sake: no key, an HTTP error or
  a torn/malformed response is logged as a warning and it returns None (the
  compaction declines; the next overweight turn tries again).

Both return the usage of every request they made (Summary.usages, one entry
per request, with its model) so the caller records each as usage/recorded and
session cost stays complete. A role summarizer that fails after some of its
requests succeeded raises SummarizerGaveUp (a SummarizerFailed) carrying the
usages of those requests; the caller records them before it reports the
failure.

How the role summarizer fits the compactor's window:

1. The budget. The window is the compactor role's
   (windows.window_for(profile, "compactor", spec): declared by the profile
   or learned from a provider's error), or DEFAULT_COMPACTOR_WINDOW_TOKENS
   (100,000) when none is known. A request may take the window minus the
   reply reserve (windows.reserve); the text of a request is estimated at
   TERRET_CHARS_PER_TOKEN characters a token (windows.estimate_tokens), and
   the system prompt and a line naming the part come off the top. What is
   left is the request's room, in characters.
2. Rendering. Every model-visible event becomes its role-tagged lines
   (render_parts). Any single part (a tool result, a message, a tool call's
   arguments, an earlier summary) longer than the part cap, a quarter of the
   room and at most MAX_PART_CHARS (32,000) characters as rendered, keeps its
   head and tail and says in between `[… N characters cut for the summary]`.
3. One request when the whole history fits the room: exactly the request of
   a short history (the summary system prompt and the rendered lines).
4. Otherwise map, then reduce. The lines are packed, in order, into
   consecutive chunks that each fit the room; an event's lines stay in one
   chunk (only an event longer than the room on its own, whose parts the cut
   keeps under a quarter of the room each, is split between its parts). Each
   chunk is summarized on its own ("part i of n"); then the part summaries,
   one tagged line each (cut like any part), are merged in one request. If
   they do not fit one request, they are packed into groups that do, each
   group is merged, and the merged summaries are merged again: at most
   MAX_ROUNDS (4) rounds of requests in all, map included. A history that
   does not come down to one summary within them, a round that does not
   shrink the number of summaries, or a window too small to leave
   MIN_ROOM_CHARS of room raises SummarizerFailed; it never loops.
   Map-then-reduce rather than a rolling summary: every request's size is
   bounded by construction (a rolling summary grows inside every later
   request and eats the room of its chunk), one chunk's summary never
   depends on a possibly bad summary of the previous ones, and the number
   of chunk requests is known before the first is made.
5. A compactor that answers ContextTooLong (its window is smaller than
   believed) is tried again, from the start, with a smaller window: the
   provider's limit_tokens, scaled by how far our estimate of the refused
   request was from the provider's requested_tokens when it gave both;
   when it named no limit below the window, the refused request's estimate
   halved (windows.halved), and halved again on the next refusal, down to
   TERRET_CONTEXT_FLOOR_TOKENS. Every try has a smaller window than the one
   before, so this ends: refused at or under the floor, or with a window
   too small to leave MIN_ROOM_CHARS, it raises SummarizerFailed. The
   window of the last refusal is recorded for the compactor's model
   (Summary.learned_window, with its source), so the next compaction starts
   within it. The usage of every request that succeeded, in any try, is
   kept.

Morph's input (MorphSummarizer): every part longer than a tenth of
MORPH_MAX_INPUT_CHARS (1,500,000 characters) is cut with the same marker, and
so is every message (Morph deletes whole lines, so it cannot trim inside one
giant line); if the messages and the query are still longer than
MORPH_MAX_INPUT_CHARS in all, the oldest messages are left out, keeping the
first user message (the previous summary, after a compaction) and the newest,
and one user message in their place says how many were left out.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from django.conf import settings
from django.db import connection

from sessions_app.errors import DefinitionMissing, SummarizerFailed, SummarizerNotConfigured
from sessions_app.llm.registry import complete_utility
from sessions_app.llm.types import ContextTooLong, ModelError, Usage
from sessions_app.log.projection import SUMMARY_PREFIX
from sessions_app.models import AgentProfile
from sessions_app.runtime import windows
from sessions_app.runtime.roles import resolve_spec

log = logging.getLogger(__name__)

MORPH_MODEL = "morph-compactor"
MORPH_COMPRESSION_RATIO = 0.5
MORPH_TIMEOUT_SECONDS = 60.0
# Morph documents a context window of 1M tokens for morph-compactor
# (docs.morphllm.com, "Compact"). 1.5M characters is about 430k tokens at 3.5
# characters a token and 600k at 2.5 (dense code), with room left for its output.
MORPH_MAX_INPUT_CHARS = 1_500_000
MORPH_QUERY_CHARS = 2_000

# The compactor's window when neither its profile nor a provider's error says.
DEFAULT_COMPACTOR_WINDOW_TOKENS = 100_000
# The longest single part (as rendered) a summary request carries.
MAX_PART_CHARS = 32_000
# Rounds of requests at most: the map, then the merges.
MAX_ROUNDS = 4
# Below this much room per request a window is too small to summarize in.
MIN_ROOM_CHARS = 2_000
# Windows tried at most when the compactor refuses requests as too long (each
# smaller than the last; halving from the default reaches any floor sooner).
MAX_WINDOW_TRIES = 8
# Kept free in each request for the line naming its part.
_HEADER_CHARS = 200

SUMMARY_SYSTEM_PROMPT = (
    "You summarize an agent's conversation so it can continue without the full history. "
    "The history below has one role-tagged line per message part; tool calls and tool results are included. "
    "Write a concise summary of the conversation so far: the user's goals and requests, decisions made, "
    "facts learned, tool calls made and what they returned (file paths, values, errors), and anything "
    "still open. Write it as plain text, in the third person, without preamble."
)
CHUNK_SYSTEM_PROMPT = (
    "You summarize one part of an agent's conversation so it can continue without the full history. "
    "The conversation is too long for one request: it is split into consecutive parts, each summarized "
    "on its own, and the summaries are merged afterwards. The part below has one role-tagged line per "
    "message part; tool calls and tool results are included. Summarize this part only: the user's goals "
    "and requests in it, decisions made, facts learned, tool calls made and what they returned (file "
    "paths, values, errors), and anything left open at its end. Do not guess at the other parts. Write "
    "it as plain text, in the third person, without preamble."
)
MERGE_SYSTEM_PROMPT = (
    "You merge summaries of consecutive parts of one agent conversation into one summary, so the "
    "conversation can continue without the full history. Below is one tagged line per part's summary, "
    "oldest first. Write one concise summary of everything they cover: the user's goals and requests, "
    "decisions made, facts learned, tool calls made and what they returned (file paths, values, errors), "
    "and anything still open; where a later part contradicts an earlier one, the later part holds. Write "
    "it as plain text, in the third person, without preamble."
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
class RequestUsage:
    """One summarizer request's usage (None: the provider reported none)."""

    model: str
    usage: Usage | None


@dataclass(frozen=True)
class Summary:
    text: str
    model: str
    usages: list[RequestUsage] = field(default_factory=list)
    # The compactor's window as learned when its provider refused a request as
    # too long (recorded as model/window with the compaction): stated by the
    # provider (source "error"), or the refused request halved ("refusal").
    learned_window: int | None = None
    learned_source: str = "error"

    @property
    def usage(self) -> Usage | None:
        """Every request's usage added up (cost None unless each was priced)."""
        known = [u.usage for u in self.usages if u.usage is not None]
        if not known:
            return None
        costs = [u.cost for u in known]
        total = None if any(c is None for c in costs) else sum(c for c in costs if c is not None)
        return Usage(sum(u.prompt_tokens for u in known), sum(u.completion_tokens for u in known), total)


class SummarizerGaveUp(SummarizerFailed):
    """SummarizerFailed after `usages` (the requests that did succeed) were spent."""

    def __init__(self, message: str, usages: list[RequestUsage]) -> None:
        super().__init__(message)
        self.usages = list(usages)


def spent(exc: BaseException) -> list[RequestUsage]:
    """The usage a failed summarize() already spent (carried by SummarizerGaveUp)."""
    return list(exc.usages) if isinstance(exc, SummarizerGaveUp) else []


class Summarizer(Protocol):
    name: str

    def summarize(self, history: History) -> Summary | None: ...


def release_connection() -> None:
    """Hand the pooled connection back before seconds of model calls. Inside a
    caller's transaction (a test, an admin action wrapped in atomic) it cannot
    be closed, and stays."""
    if not connection.in_atomic_block:
        connection.close()


# ---------------------------------------------------------------- rendering


def cut_marker(n: int) -> str:
    return f"[… {n} characters cut for the summary]"


def cut(text: str, limit: int) -> str:
    """`text` when it is at most `limit` characters; else its head and tail
    around a line saying how many characters were cut, `limit` in all."""
    if len(text) <= limit:
        return text
    keep = max(limit - len(cut_marker(len(text))) - 2, 0)
    head = keep * 2 // 3
    tail = keep - head
    return f"{text[:head]}\n{cut_marker(len(text) - keep)}\n{text[len(text) - tail :]}"


def _indent(text: str) -> str:
    # Continuation lines of a multi-line part are indented so they can never
    # be read as a tag of their own.
    return text.replace("\n", "\n  ")


def _tagged(tag: str, text: str | None, cap: int | None = None) -> str:
    """One role-tagged line; with `cap`, at most that long as rendered."""
    prefix = f"[{tag}] "
    body = (text or "").replace("\r\n", "\n")
    line = prefix + _indent(body)
    if cap is None or len(line) <= cap:
        return line
    room = max(cap - len(prefix), 0)
    keep = room
    for _ in range(3):  # newlines grow as they are indented: shrink until it fits
        rendered = _indent(cut(body, keep))
        if len(rendered) <= room:
            return prefix + rendered
        keep = max(keep * room // len(rendered) - 1, 0)
    # Each character renders to at most three (a newline and its indent).
    return prefix + _indent(cut(body, room // 3))


def render_parts(event: HistoryEvent, cap: int | None = None) -> list[str]:
    """The role-tagged lines of one model-visible event; with `cap`, a part
    longer than that (as rendered) is cut with a marker."""
    kind, data = event.kind, event.data
    if kind == "session/compacted":
        return [_tagged("summary of earlier conversation", data["summary"], cap)]
    if kind in ("user/message", "context/injected"):
        return [_tagged("user", data["text"], cap)]
    if kind == "assistant/message":
        lines = [_tagged("assistant", data["content"], cap)] if data.get("content") else []
        for call in data.get("tool_calls") or []:
            text = f"{call['name']} {call['arguments'] or '{}'}"
            lines.append(_tagged(f"assistant tool call {call['id']}", text, cap))
        return lines
    if kind == "tool/result":
        status = "error" if data.get("is_error") else "ok"
        return [_tagged(f"tool result {data['call_id']} {data['name']} {status}", data["content"], cap)]
    return []


def render_history(history: History, cap: int | None = None) -> str:
    return "\n".join(line for event in history.events for line in render_parts(event, cap))


_MORPH_ROLES = {
    "session/compacted": "user",
    "user/message": "user",
    "context/injected": "user",
    "assistant/message": "assistant",
    "tool/result": "tool",
}


def role_messages(history: History, cap: int | None = None) -> list[dict[str, str]]:
    """One {role, content} message per event, tool calls and results written
    into the content (Morph takes plain role/content pairs). With `cap`, each
    part and each message is cut to that many characters."""
    out: list[dict[str, str]] = []
    for event in history.events:
        lines = render_parts(event, cap)
        if not lines:
            continue
        if event.kind == "session/compacted":
            content = SUMMARY_PREFIX + event.data["summary"]
        elif event.kind in ("user/message", "context/injected"):
            content = event.data["text"]
        else:
            content = "\n".join(lines)
        out.append({"role": _MORPH_ROLES[event.kind], "content": content if cap is None else cut(content, cap)})
    return out


# ---------------------------------------------------------------- role summarizer


def _pack(groups: Iterable[list[str]], room: int) -> list[list[str]]:
    """Consecutive chunks of lines, each at most `room` characters joined by
    newlines. A group's lines stay in one chunk unless the group alone is
    longer than the room; then it is split between its lines (each of which
    must fit the room)."""
    chunks: list[list[str]] = []
    current: list[str] = []
    size = 0
    for group in groups:
        if not group:
            continue
        length = sum(len(line) for line in group) + len(group) - 1
        if current and size + 1 + length > room:
            chunks.append(current)
            current, size = [], 0
        if length <= room:
            size += length + (1 if current else 0)
            current.extend(group)
            continue
        for line in group:  # one event over the room on its own
            if current and size + 1 + len(line) > room:
                chunks.append(current)
                current, size = [], 0
            size += len(line) + (1 if current else 0)
            current.append(line)
    if current:
        chunks.append(current)
    return chunks


@dataclass
class _Piece:
    """A summary standing for parts first..last of the map's n."""

    text: str
    first: int
    last: int

    def tag(self, n: int) -> str:
        parts = f"part {self.first}" if self.first == self.last else f"parts {self.first} to {self.last}"
        return f"summary of {parts} of {n}"


class _Plan:
    """One try at summarizing `history` within `window` tokens (module docstring)."""

    def __init__(self, spec: str, window: int, usages: list[RequestUsage]) -> None:
        self.spec = spec
        self.window = window
        self.usages = usages
        self.last_estimate = 0  # estimated tokens of the latest request sent

    def room(self, system: str, header: int = 0) -> int:
        budget = self.window - windows.reserve(self.window)
        overhead = windows.estimate_tokens([{"content": ""}, {"content": ""}])
        return int((budget - overhead) * settings.TERRET_CHARS_PER_TOKEN) - len(system) - header

    def fail(self, reason: str) -> SummarizerGaveUp:
        return SummarizerGaveUp(reason, self.usages)

    def ask(self, system: str, user: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self.last_estimate = windows.estimate_tokens(messages)
        reply = complete_utility(self.spec, messages)
        self.usages.append(RequestUsage(self.spec, reply.usage))
        return (reply.content or "").strip()

    def run(self, history: History) -> str:
        room = self.room(CHUNK_SYSTEM_PROMPT, _HEADER_CHARS)
        if room < MIN_ROOM_CHARS:
            raise self.fail(
                f"the compactor model {self.spec}'s window of {self.window} tokens leaves too little room "
                f"to summarize in ({max(room, 0)} characters a request, {MIN_ROOM_CHARS} needed)"
            )
        cap = min(MAX_PART_CHARS, room // 4)
        groups = [lines for lines in (render_parts(e, cap) for e in history.events) if lines]
        whole = "\n".join(line for group in groups for line in group)
        if len(whole) <= self.room(SUMMARY_SYSTEM_PROMPT):
            return self.ask(SUMMARY_SYSTEM_PROMPT, whole)
        chunks = _pack(groups, room)
        n = len(chunks)
        pieces = [
            _Piece(self.ask(CHUNK_SYSTEM_PROMPT, f"Part {i} of {n} of the conversation:\n" + "\n".join(chunk)), i, i)
            for i, chunk in enumerate(chunks, 1)
        ]
        rounds = 1
        while True:
            lines = [_tagged(p.tag(n), p.text, cap) for p in pieces]
            merged = "\n".join(lines)
            if len(merged) <= self.room(MERGE_SYSTEM_PROMPT, _HEADER_CHARS):
                header = f"Summaries of all {n} parts of the conversation:\n"
                return self.ask(MERGE_SYSTEM_PROMPT, header + merged)
            if rounds + 2 > MAX_ROUNDS:
                raise self.fail(
                    f"the history ({len(whole)} characters in {n} parts) did not come down to one summary "
                    f"within {MAX_ROUNDS} rounds of requests to {self.spec}"
                )
            groups_of = _pack(([line] for line in lines), room)
            if len(groups_of) >= len(pieces):
                raise self.fail(f"the summaries of {n} parts do not shrink when merged by {self.spec}")
            merged_pieces: list[_Piece] = []
            at = 0
            for j, group in enumerate(groups_of, 1):
                covered = pieces[at : at + len(group)]
                at += len(group)
                first, last = covered[0].first, covered[-1].last
                header = f"Summaries of parts {first} to {last} of {n} (group {j} of {len(groups_of)}):\n"
                merged_pieces.append(_Piece(self.ask(MERGE_SYSTEM_PROMPT, header + "\n".join(group)), first, last))
            pieces = merged_pieces
            rounds += 1


def smaller_window(window: int, refused: ContextTooLong, estimate: int) -> int | None:
    """The window to try again with after `refused`: the provider's limit in
    our estimate's units (scaled by estimate/requested when it gave both)
    when it is below `window`, else the refused request halved
    (windows.halved), always below `window`. None: nothing above the floor
    is left to try."""
    limit = refused.limit_tokens
    if limit and refused.requested_tokens and estimate:
        limit = int(limit * estimate / refused.requested_tokens)
    if limit and limit < window:
        return limit
    halved = windows.halved(min(estimate, window) if estimate else window)
    return halved if halved is not None and halved < window else None


class RoleSummarizer:
    """Utility requests to the compactor model role, fitted to its window."""

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

    def window(self, spec: str) -> int:
        return windows.window_for(self.profile, "compactor", spec) or DEFAULT_COMPACTOR_WINDOW_TOKENS

    def summarize(self, history: History) -> Summary:
        spec = self.spec()
        window = self.window(spec)
        release_connection()  # the reads are done; the requests may take seconds each
        usages: list[RequestUsage] = []
        plan = _Plan(spec, window, usages)
        learned: tuple[int, str] | None = None
        # Each try's window is below the one before, down to the floor, and
        # there are at most MAX_WINDOW_TRIES of them: this ends.
        for tries in range(1, MAX_WINDOW_TRIES + 1):
            try:
                text = plan.run(history)
                break
            except ContextTooLong as refused:
                smaller = smaller_window(plan.window, refused, plan.last_estimate)
                if smaller is None or tries == MAX_WINDOW_TRIES:
                    raise SummarizerGaveUp(
                        f"the compactor model {spec} refused the request as too long for its context window "
                        f"(tried within {plan.window} tokens, {tries} windows in all), and no smaller window is "
                        f"left to try above the floor of {settings.TERRET_CONTEXT_FLOOR_TOKENS} tokens: {refused}",
                        usages,
                    ) from refused
                stated = refused.limit_tokens
                learned = (stated, "error") if stated else (smaller, "refusal")
                log.info("compactor %s refused %s tokens as too long; again within %s", spec, plan.window, smaller)
                plan = _Plan(spec, smaller, usages)
            except ModelError as exc:
                raise SummarizerGaveUp(f"the compactor model {spec} failed: {exc}", usages) from exc
        if learned is None:
            return Summary(text, spec, usages)
        return Summary(text, spec, usages, learned[0], learned[1])


# ---------------------------------------------------------------- morph


def _left_out(n: int) -> str:
    return f"[… {n} earlier messages were left out to fit Morph's input limit]"


def fit_messages(messages: list[dict[str, str]], limit: int) -> list[dict[str, str]]:
    """`messages` when their contents total at most `limit` characters; else
    without the oldest ones (the first user message is kept, and the newest
    always), with a user message in their place saying how many were left out."""
    total = sum(len(m["content"]) for m in messages)
    if total <= limit:
        return messages
    keep = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    first = [messages[keep]] if keep is not None else []
    rest = [m for i, m in enumerate(messages) if i != keep]
    dropped = 0
    while dropped < len(rest) - 1 and total > limit:
        total -= len(rest[dropped]["content"])
        if not dropped:
            total += len(_left_out(1))
        elif len(_left_out(dropped + 1)) != len(_left_out(dropped)):
            total += 1
        dropped += 1
    if not dropped:
        return messages
    return [*first, {"role": "user", "content": _left_out(dropped)}, *rest[dropped:]]


class MorphSummarizer:
    """Morph's Compact API: POST {MORPH_BASE_URL}/compact.

    Wire format from Morph's documentation of the native endpoint
    (docs.morphllm.com, "Compact" / API reference POST /v1/compact): request
    {"messages": [{role, content}], "query", "compression_ratio", "model":
    "morph-compactor", "include_markers", "include_line_ranges"} with a Bearer
    key; response {"id", "model", "output": "<compacted text>", "usage":
    {"input_tokens", "output_tokens", "compression_ratio", ...}}. Morph
    returns no price, so its usage is recorded as unpriced. The input is cut
    to MORPH_MAX_INPUT_CHARS (module docstring)."""

    name = "morph"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        max_input_chars: int | None = None,
    ):
        self.api_key = settings.MORPH_API_KEY if api_key is None else api_key
        self.base_url = (base_url or settings.MORPH_BASE_URL or "").rstrip("/")
        self.timeout = MORPH_TIMEOUT_SECONDS if timeout is None else timeout
        self.max_input_chars = MORPH_MAX_INPUT_CHARS if max_input_chars is None else max_input_chars

    def request_body(self, history: History) -> dict[str, Any]:
        cap = max(self.max_input_chars // 10, 1)  # Morph cannot trim inside one giant line
        messages = role_messages(history, cap)
        query = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")[:MORPH_QUERY_CHARS]
        messages = fit_messages(messages, self.max_input_chars - len(query))
        body: dict[str, Any] = {
            "model": MORPH_MODEL,
            "messages": messages,
            "compression_ratio": MORPH_COMPRESSION_RATIO,
            "include_markers": True,
            "include_line_ranges": False,
        }
        if query:
            body["query"] = query
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
        return Summary(output.strip(), model, [RequestUsage(model, _morph_usage(payload.get("usage")))])


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


SUMMARIZERS = ("role", "morph")


def get_summarizer(profile: AgentProfile | None, session_id: uuid.UUID | str | None = None) -> Summarizer:
    """The profile's summarizer (role unless the profile says morph). One
    this code does not have (a newer release's, a removed one) raises
    DefinitionMissing: never quietly another summarizer."""
    name = profile.summarizer if profile is not None else "role"
    if name == "morph":
        return MorphSummarizer()
    if name and name not in SUMMARIZERS:
        raise DefinitionMissing(f"summarizer:{name}", f"the running code has no summarizer {name!r}")
    return RoleSummarizer(profile, session_id)
