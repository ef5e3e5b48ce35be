"""Stopping a model call from outside it: a cancel, or its deadline.

An `Abort` is handed to `Adapter.complete`. Whoever decides the call must
stop (the runtime's stop watch on a cancel, the deadline timer) calls
`set(reason)`; the adapter, which alone knows its stream, has bound a hook
that interrupts the blocked read at once (`bind`), so a silent or a
keep-alive-only stream stops within the poll interval, not at its next byte.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

CANCELLED = "cancelled"
DEADLINE = "deadline"
SUPERSEDED = "superseded"  # the caller's lease moved on: nothing it would write can land


class Abort:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._hooks: list[Callable[[], None]] = []
        self.reason = ""

    def set(self, reason: str) -> None:
        """Stop the call for `reason` (CANCELLED, DEADLINE, SUPERSEDED); the first reason wins."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            hooks = list(self._hooks)
        for hook in hooks:
            hook()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` unless aborted meanwhile; True when aborted."""
        return self._event.wait(timeout)

    def bind(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run `hook` when the abort is set (at once if it already is);
        returns a function that unbinds it."""
        with self._lock:
            fired = self._event.is_set()
            if not fired:
                self._hooks.append(hook)
        if fired:
            hook()

        def unbind() -> None:
            with self._lock:
                if hook in self._hooks:
                    self._hooks.remove(hook)

        return unbind
