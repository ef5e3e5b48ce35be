"""Fan-out of committed events: in-process listeners, in seq order per session.

Listeners (`on_event`) run after commit, one at a time per process, in seq
order per session, even when two threads' commit callbacks run in the
opposite order to their commits (the dispatcher's reservations keep that).
A listener's own append is delivered after the event it is handling, never
nested. A failing listener is logged and does not affect the others. The
hint to the session's channel-layer group goes out at the same moment
(hints.py).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable

from sessions_app.log import hints
from sessions_app.log.records import AppendedEvent

log = logging.getLogger(__name__)

Listener = Callable[[AppendedEvent], None]
_listeners: list[tuple[frozenset[str] | None, Listener]] = []


def on_event(*kinds: str) -> Callable[[Listener], Listener]:
    """Register a session-event listener for the given kinds (none: every kind).

    Listeners run after commit, in seq order per session, one at a time per
    process. A listener's own append is queued behind the event it is
    handling. A failing listener is logged and does not affect the others.
    """

    def register(fn: Listener) -> Listener:
        _listeners.append((frozenset(kinds) if kinds else None, fn))
        return fn

    return register


class _Dispatcher:
    """Delivers committed events to listeners in seq order per session.

    A seq is reserved under the row lock, before commit; delivery of a later
    seq waits until every earlier reservation made in this process has either
    committed or rolled back. That keeps order even when two threads' commit
    callbacks run in the opposite order to their commits.

    An autocommit append (the Postgres fast path) cannot reserve: its seq is
    known only when its statement returns, already committed. While one is in
    flight (begin() .. end()) nothing of its session is delivered, because an
    event committed after it, with a higher seq, may already be waiting.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reserved: dict[uuid.UUID, set[int]] = defaultdict(set)
        self._ready: dict[uuid.UUID, dict[int, AppendedEvent]] = defaultdict(dict)
        self._inflight: dict[uuid.UUID, int] = defaultdict(int)
        self._draining = False

    def reserve(self, session_id: uuid.UUID, seq: int) -> None:
        with self._lock:
            self._reserved[session_id].add(seq)

    def release(self, session_id: uuid.UUID, seqs: list[int]) -> None:
        with self._lock:
            reserved = self._reserved.get(session_id)
            if reserved is not None:
                reserved.difference_update(seqs)
                if not reserved:  # no empty entry per rolled-back session, forever
                    del self._reserved[session_id]
        self._drain()

    def committed(self, event: AppendedEvent) -> None:
        with self._lock:
            self._ready[event.session_id][event.seq] = event
        self._drain()

    def begin(self, session_id: uuid.UUID) -> None:
        with self._lock:
            self._inflight[session_id] += 1

    def end_many(self, session_id: uuid.UUID, events: list[AppendedEvent]) -> None:
        with self._lock:
            for event in events[:-1]:
                self._ready[session_id][event.seq] = event
        self.end(session_id, events[-1] if events else None)

    def end(self, session_id: uuid.UUID, event: AppendedEvent | None) -> None:
        """The in-flight autocommit append finished: committed as `event`, or
        failed (None)."""
        with self._lock:
            if event is not None:
                self._ready[session_id][event.seq] = event
            left = self._inflight[session_id] - 1
            if left > 0:
                self._inflight[session_id] = left
            else:
                del self._inflight[session_id]
        self._drain()

    def _next_batch(self) -> list[AppendedEvent]:
        out: list[AppendedEvent] = []
        for sid in list(self._ready):
            if self._inflight.get(sid):
                continue
            ready = self._ready[sid]
            reserved = self._reserved.get(sid, set())
            for seq in sorted(ready):
                if any(r < seq for r in reserved):
                    break
                out.append(ready.pop(seq))
                reserved.discard(seq)
            if not ready:
                del self._ready[sid]
            if sid in self._reserved and not self._reserved[sid]:
                del self._reserved[sid]
        return out

    def _drain(self) -> None:
        # One drainer at a time; an append made by a listener lands in _ready
        # and is picked up by the loop below after the current event is done.
        with self._lock:
            if self._draining:
                return
            self._draining = True
        try:
            while True:
                with self._lock:
                    batch = self._next_batch()
                    if not batch:
                        self._draining = False
                        return
                for event in batch:
                    _deliver(event)
        except BaseException:
            with self._lock:
                self._draining = False
            raise


def _deliver(event: AppendedEvent) -> None:
    for kinds, fn in list(_listeners):
        if kinds is not None and event.kind not in kinds:
            continue
        try:
            fn(event)
        except Exception:
            log.exception("session listener %s failed on %s#%s %s", fn, event.session_id, event.seq, event.kind)


dispatcher = _Dispatcher()


def after_commit(events: list[AppendedEvent]) -> None:
    """A transaction holding `events` (one session's, in seq order) committed."""
    for event in events:
        dispatcher.committed(event)
    if events:
        hints.publish_event(events[-1].session_id, events[-1].seq)
