"""A model call's wall-clock deadline, and the error a stopped call ends with.

One watchdog thread per process serves every call: `arm(abort, seconds)`
pushes the deadline on a heap and the thread sets `abort` (reason DEADLINE)
when it passes. A process runs a few hundred concurrent calls, and a
threading.Timer per call would mean a thread started and joined per call;
here arming is a heap push and disarming marks the entry dead.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from sessions_app.llm.abort import DEADLINE, Abort
from sessions_app.llm.types import ModelCancelled, ModelDeadline, ModelError, ModelReply

logger = logging.getLogger(__name__)

# Dead (disarmed) entries stay in the heap until they reach its top; past
# this many, and once they are most of the heap, it is rebuilt without them.
_COMPACT_AFTER = 256

# A heap entry: [when (monotonic), sequence, the Abort or None once disarmed or fired].
# A list, not a dataclass: it is compared on every push and pop.
_Entry = list[Any]


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[_Entry] = []
        self._dead = 0
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, abort: Abort, seconds: float) -> Callable[[], None]:
        entry: _Entry = [time.monotonic() + seconds, next(self._seq), abort]
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="terret-llm-deadline", daemon=True)
                self._thread.start()
            if self._heap[0] is entry:
                # Only an earlier deadline than the one it sleeps towards needs a wake-up.
                self._cond.notify()
        return lambda: self._disarm(entry)

    def pending(self) -> int:
        """Armed deadlines that have neither fired nor been disarmed."""
        with self._cond:
            return len(self._heap) - self._dead

    def _disarm(self, entry: _Entry) -> None:
        with self._cond:
            if entry[2] is None:
                return
            entry[2] = None
            self._dead += 1
            if self._dead > _COMPACT_AFTER and self._dead * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._dead = 0

    def _run(self) -> None:
        while True:
            for abort in self._wait_for_due():
                try:
                    abort.set(DEADLINE)
                except Exception:  # one broken hook must not stop every other call's deadline
                    logger.exception("a deadline hook failed")

    def _wait_for_due(self) -> list[Abort]:
        with self._cond:
            while True:
                due = self._pop_due(time.monotonic())
                if due:
                    return due
                timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                self._cond.wait(timeout)

    def _pop_due(self, now: float) -> list[Abort]:
        due: list[Abort] = []
        while self._heap and (self._heap[0][2] is None or self._heap[0][0] <= now):
            entry = heapq.heappop(self._heap)
            if entry[2] is None:
                self._dead -= 1
                continue
            due.append(entry[2])
            entry[2] = None  # fired: a later disarm is a no-op
        return due


_WATCHDOG = _Watchdog()


def _after_fork() -> None:
    # The child has no watchdog thread, and the lock may have been held at the fork.
    global _WATCHDOG
    _WATCHDOG = _Watchdog()


os.register_at_fork(after_in_child=_after_fork)


def arm(abort: Abort, seconds: float) -> Callable[[], None]:
    """Set `abort` with reason DEADLINE `seconds` from now, unless the
    returned function (disarm; idempotent) is called first."""
    return _WATCHDOG.arm(abort, seconds)


def pending() -> int:
    """How many deadlines are armed in this process (tests, diagnostics)."""
    return _WATCHDOG.pending()


def watchdog_threads() -> int:
    """Live watchdog threads in this process: at most one."""
    return sum(1 for t in threading.enumerate() if t.name == "terret-llm-deadline")


def stop_error(abort: Abort, spec: str, partial: ModelReply, deadline: float | None = None) -> ModelError:
    """What a call stopped by `abort` raises: ModelDeadline for its deadline,
    else ModelCancelled carrying `partial` (text and usage; no tool calls)."""
    if abort.reason == DEADLINE:
        within = f" ({deadline:g}s, TERRET_LLM_DEADLINE_SECONDS)" if deadline is not None else ""
        late = ModelDeadline(f"{spec}: no complete reply within the call's deadline{within}")
        late.usage = partial.usage
        return late
    return ModelCancelled(f"{spec}: the model call was cancelled", partial)
