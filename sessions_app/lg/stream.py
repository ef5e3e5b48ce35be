"""A run's SSE stream, read from the log.

Committed events are read from the database after a cursor (never from a
hint: hints only say "read now"), folded through mapping.Tracker and sent as
LangGraph stream events. Every frame made from a committed event carries an
`id:` naming it: "N" on the last frame made from event seq N and "N.k" on
the k-th before it, so a `Last-Event-ID` resumes exactly after the frame it
names, from the log, at any later time (nothing expires). Token deltas, the
`metadata` frame and `end` are not events of the log and carry no id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from channels.db import database_sync_to_async

from sessions_app import actions
from sessions_app.errors import InvalidInput, TerretError, Unauthenticated
from sessions_app.lg import mapping, ops
from sessions_app.live import hub
from sessions_app.log import hints
from sessions_app.log.reads import events_after, more_follow
from sessions_app.log.records import LoggedEvent
from sessions_app.models import Session
from sessions_app.services.tokens import token_is_live

logger = logging.getLogger(__name__)

MODES = ("values", "updates", "messages-tuple", "messages", "custom")
# LangGraph's other stream modes are accepted (useStream asks for "tools", for
# one) and produce nothing: Terret has no graph nodes, tasks or checkpoints
# of the kinds they describe.
SILENT_MODES = ("events", "tasks", "checkpoints", "debug", "tools", "lifecycle")
PAGE = 200
# Hints from the hub say when to read (only the events after the cursor);
# the poll is the net under a lost hint: every POLL_SECONDS while the hub
# delivers, every UNWATCHED_POLL_SECONDS when it could not subscribe.
POLL_SECONDS = 5.0
UNWATCHED_POLL_SECONDS = 1.0
TOKEN_CHECK_SECONDS = 2.0  # a revoked token ends the stream within this (plus TOKEN_CACHE_SECONDS)
TOKEN_CACHE_SECONDS = 1.0
CHECK_SECONDS = 5.0  # the thread's access and a pending run's withdrawal
KEEPALIVE_SECONDS = 15.0

POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="terret-lg-read")


def _in_thread(fn: Any) -> Any:
    return database_sync_to_async(fn, thread_sensitive=False, executor=POOL)


DEFAULT_MODES = ("values",)


def parse_modes(value: Any) -> tuple[str, ...]:
    """The stream modes asked for. Absent or empty (None, "", [], [""]: what
    the SDKs send for their default arguments, e.g. join_stream's
    `stream_mode=`) is the run's own modes; Terret keeps no per-run modes, so
    that is LangGraph's default for a run, values."""
    if value is None or isinstance(value, str):
        modes: list[Any] = [value] if value else []
    elif isinstance(value, list):
        modes = [m for m in value if m != ""]
    else:
        raise InvalidInput("stream_mode must be a string or a list of strings")
    if not modes:
        return DEFAULT_MODES
    bad = [m for m in modes if m not in MODES and m not in SILENT_MODES]
    if bad:
        raise InvalidInput(f"unknown stream_mode {str(bad[0])[:40]!r}; Terret streams {', '.join(MODES)}")
    return tuple(dict.fromkeys(modes))


def parse_last_event_id(value: str | None) -> tuple[int, int] | None:
    """(seq, frames of that seq already received) for "N" / "N.k"; "N" means
    every frame of N was received."""
    if not value or value.strip() == "-1":
        return None  # "-1": useStream's joinStream asks for the run from its start
    seq_part, _, sub = value.strip().partition(".")
    if not (seq_part.isascii() and seq_part.isdigit()) or len(seq_part) > 18:
        raise InvalidInput("Last-Event-ID must be an id this stream sent ('N' or 'N.k')")
    if sub and not (sub.isascii() and sub.isdigit() and len(sub) < 6):
        raise InvalidInput("Last-Event-ID must be an id this stream sent ('N' or 'N.k')")
    return int(seq_part), (int(sub) + 1 if sub else -1)


def sse(event: str, data: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@dataclass
class Plan:
    """What one stream sends: the run, the modes, where to start."""

    session_id: uuid.UUID
    run_id: str
    open_seq: int
    modes: tuple[str, ...]
    resume: tuple[int, int] | None  # from Last-Event-ID
    user: Any
    token_id: int | None = None  # the request's token, re-checked while the stream lasts


class _Listener:
    """hub.Subscriber: notes hints and keeps live token deltas."""

    def __init__(self) -> None:
        self.news = asyncio.Event()
        self.deltas: deque[dict[str, Any]] = deque(maxlen=1024)
        self.target = 0  # the newest seq a hint named

    def on_hint(self, seq: int) -> None:
        self.target = max(self.target, seq)
        self.news.set()

    def on_delta(self, frame: str) -> None:
        try:
            self.deltas.append(json.loads(frame))
        except ValueError:
            return
        self.news.set()


class RunStream:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.sid = str(plan.session_id)
        self.tracker = mapping.Tracker(self.sid)
        self.cursor = 0
        self.skip = 0
        self.partial: dict[int, str] = {}
        self.streamed: dict[str, str] = {}  # message id -> the text this connection sent as deltas
        self.committed: set[str] = set()  # ids of the AI messages this connection sent committed
        self.failed = False  # an error event went out: the stream ends after it

    # ------------------------------------------------------------ setup

    def prime(self) -> None:
        """Fold the log up to where the stream starts (runs in a thread)."""
        plan = self.plan
        if plan.resume is not None:
            seq, received = plan.resume
            self.cursor, self.skip = (seq, 0) if received < 0 else (seq - 1, received)
        else:
            self.cursor = plan.open_seq - 1
        session = Session.objects.select_related("profile").get(id=plan.session_id)
        tv = ops.view(session, upto=self.cursor)
        self.tracker = tv.tracker

    def segment(self) -> mapping.Segment | None:
        for seg in reversed(self.tracker.segments):
            if seg.open_seq == self.plan.open_seq:
                return seg
        return None

    # ------------------------------------------------------------ frames

    def frames_for(self, event: LoggedEvent) -> list[tuple[str, Any]]:
        """The stream events one committed event makes, in order."""
        change = self.tracker.feed(event)
        mine = self.segment()
        if mine is None or (mine.ended and change.ended is not mine):
            return []  # another run's event (a turn still running before ours opens)
        modes = self.plan.modes
        out: list[tuple[str, Any]] = []
        interrupt = None
        if change.interrupt:
            interrupt = mapping.interrupt_of(self.sid, change.interrupt)
        # The message frames go before `values`: useStream places a message
        # it first meets in a `messages` frame at the end of the list it holds,
        # so a `values` that already holds it would show it twice.
        if change.message is not None and change.message["type"] != "human":
            meta = {"langgraph_node": change.node, "langgraph_step": self.tracker.step, "run_id": self.plan.run_id}
            if "messages-tuple" in modes:
                out.append(("messages", [self._committed(change.message), meta]))
            if "messages" in modes:
                out.append(("messages/complete", [change.message]))
        if "values" in modes and change.opened is mine and event.data.get("regenerate"):
            # A run that takes in no input (a regenerate) starts with the state it
            # answers, as LangGraph's first `values` does: a client showing the
            # reply being replaced drops it before the new one streams in.
            out.append(("values", {"messages": list(self.tracker.messages)}))
        if "values" in modes and (change.message is not None or interrupt is not None):
            values: dict[str, Any] = {"messages": list(self.tracker.messages)}
            if interrupt is not None:
                values["__interrupt__"] = [interrupt]
            out.append(("values", values))
        if "updates" in modes and change.message is not None and change.message["type"] != "human":
            out.append(("updates", {change.node: {"messages": [change.message]}}))
        if "updates" in modes and interrupt is not None:
            out.append(("updates", {"__interrupt__": [interrupt]}))
        if "custom" in modes:
            out.append(("custom", {"seq": event.seq, "kind": event.kind, "data": event.data}))
        if change.error is not None:
            out.append(("error", {"error": "RunError", "message": change.error}))
            self.failed = True
        return out

    def _committed(self, message: dict[str, Any]) -> dict[str, Any]:
        """A committed message for messages-tuple: whole, unless this
        connection streamed its text already (then only what completes it)."""
        ident = str(message.get("id"))
        if message["type"] != "ai":
            return message
        self.committed.add(ident)
        streamed = self.streamed.pop(ident, None)
        return message if streamed is None else mapping.completing_chunk(message, streamed)

    def event_text(self, event: LoggedEvent) -> str:
        frames = self.frames_for(event)
        parts = []
        for k, (name, data) in enumerate(frames):
            if event.seq == self.cursor + 1 and k < self.skip:
                continue  # the client had these before it reconnected
            ident = str(event.seq) if k == len(frames) - 1 else f"{event.seq}.{k}"
            parts.append(sse(name, data, ident))
        return "".join(parts)

    def delta_text(self, delta: dict[str, Any]) -> str:
        modes = self.plan.modes
        step = int(delta.get("step") or 0)
        text = str(delta.get("text") or "")
        if not text or self.tracker.turn_seq is None:
            return ""
        chunk = mapping.delta_chunk(self.tracker.turn_seq, step, text)
        if chunk["id"] in self.committed:
            return ""  # late: the step's message went out already, whole
        out = ""
        if "messages-tuple" in modes:
            meta = {"langgraph_node": "agent", "langgraph_step": step, "run_id": self.plan.run_id}
            self.streamed[chunk["id"]] = self.streamed.get(chunk["id"], "") + text
            out += sse("messages", [chunk, meta])
        if "messages" in modes:
            self.partial[step] = self.partial.get(step, "") + text
            whole = {**chunk, "type": "ai", "content": self.partial[step]}
            out += sse("messages/partial", [whole])
        return out

    # ------------------------------------------------------------ the loop

    async def body(self) -> AsyncGenerator[str]:
        listener = _Listener()
        hints.publisher.register_server_loop(asyncio.get_running_loop())
        watching = False
        try:
            await hub.process_hub().subscribe(self.plan.session_id, listener)
            watching = True
        except Exception:
            logger.warning("no hints for %s; the stream polls", self.sid, exc_info=True)
        try:
            await _in_thread(self.prime)()
            if self.plan.resume is None:
                yield sse("metadata", {"run_id": self.plan.run_id, "attempt": 1})
            poll = POLL_SECONDS if watching else UNWATCHED_POLL_SECONDS
            async for text in self._follow(listener, poll):
                yield text
        finally:
            if watching:
                await hub.process_hub().unsubscribe(self.plan.session_id, listener)

    async def _follow(self, listener: _Listener, poll: float) -> AsyncIterator[str]:
        """Reads only what a hint names past the cursor (or what the poll
        finds): an idle stream costs no read of the thread, only the token's
        check every TOKEN_CHECK_SECONDS (shared by the token's streams)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        polled = checked = token_checked = quiet_since = now
        read = True
        while True:
            seg = self.segment()
            if seg is not None and seg.ended:
                yield sse("end", None)
                return
            listener.news.clear()
            if read or listener.target > self.cursor:
                read = False
                polled = loop.time()
                rows = await _in_thread(events_after)(self.plan.session_id, self.cursor, PAGE)
                for event in rows:
                    text = self.event_text(event)
                    self.cursor, self.skip = event.seq, 0
                    if text:
                        quiet_since = loop.time()
                        yield text
                    if self.failed:
                        return
                    seg = self.segment()
                    if seg is not None and seg.ended:
                        break
                if more_follow(rows, PAGE) or (seg is not None and seg.ended):
                    read = True
                    continue
            while listener.deltas:
                text = self.delta_text(listener.deltas.popleft())
                if text:
                    yield text
            now = loop.time()
            wake = min(polled + poll * random.uniform(0.8, 1.2), token_checked + TOKEN_CHECK_SECONDS)
            try:
                await asyncio.wait_for(listener.news.wait(), max(0.01, wake - now))
            except TimeoutError:
                pass
            now = loop.time()
            read = now - polled >= poll * 0.8
            if now - token_checked >= TOKEN_CHECK_SECONDS:
                token_checked = now
                await self._check_token()
            if now - checked >= CHECK_SECONDS:
                checked = now
                if not await _in_thread(self._still_allowed)():
                    yield sse("end", None)
                    return
            if now - quiet_since > KEEPALIVE_SECONDS:
                quiet_since = now
                yield ": keep-alive\n\n"

    async def _check_token(self) -> None:
        """A revoked token (or its user deactivated) ends the stream (raises)."""
        if self.plan.token_id is not None and not await token_live(self.plan.token_id):
            raise Unauthenticated("the token was revoked")

    def _still_allowed(self) -> bool:
        """The thread still visible to the user (else raises). False when the
        run never opened and never will (queued input that was withdrawn)."""
        actions.session_for(self.plan.user, self.plan.session_id, "view")
        if self.segment() is not None:
            return True
        return not ops.run_withdrawn(self.plan.session_id, self.plan.open_seq)


_token_checks: dict[int, tuple[float, bool]] = {}


async def token_live(token_id: int) -> bool:
    """Whether the token is live, read at most once per TOKEN_CACHE_SECONDS
    per process however many streams, joins and waits ride it (24 joins of
    one user cost one indexed query a second, not 24)."""
    now = asyncio.get_running_loop().time()
    found = _token_checks.get(token_id)
    if found is not None and now - found[0] < TOKEN_CACHE_SECONDS:
        return found[1]
    live = bool(await _in_thread(token_is_live)(token_id))
    if len(_token_checks) > 10_000:
        _token_checks.clear()
    _token_checks[token_id] = (asyncio.get_running_loop().time(), live)
    return live


async def wait_for_end(plan: Plan, limit: float) -> bool:
    """Wait for the run to end (True) or `limit` seconds (False), the way a
    stream follows it: hints from the hub, then only the events after the
    cursor; never the thread re-read per tick. A revoked token raises."""
    follower = RunStream(replace(plan, modes=(), resume=None))
    try:
        async with asyncio.timeout(limit), aclosing(follower.body()) as frames:
            async for _ in frames:
                pass
    except TimeoutError:
        return False
    return True


async def guarded(stream: RunStream) -> AsyncIterator[str]:
    """The stream's body; a failure after the headers went out becomes an
    `error` event (and the stream ends), never a silent cut."""
    try:
        async for text in stream.body():
            yield text
    except asyncio.CancelledError:
        raise
    except TerretError as exc:
        yield sse("error", {"error": exc.code, "message": str(exc)})
    except Exception:
        logger.exception("langgraph stream for %s failed", stream.sid)
        yield sse("error", {"error": "internal_error", "message": "internal error"})
