"""The stop watch: a cancel reaches a model call while it streams.

A cancel is a log event (turn/cancel_requested, projected as the session's
`cancel_seq`), committed by whichever process took the request. A worker
streaming a model reply for that session learns of it here: one thread per
process polls the sessions of the calls in flight every
TERRET_CANCEL_POLL_SECONDS (one indexed read for all of them) and sets each
cancelled call's Abort, which interrupts the stream at once (llm/abort.py).
Polling the database, not a broker, keeps Stop working on the embedded
path and through a Redis outage.

The same read stops a call whose lease generation moved on (SUPERSEDED):
another worker took the session over, or a cancel or an operator closed
the turn after the lease lapsed (SessionTx.fence_out). Nothing the call
would write can land, so streaming on would only spend tokens.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator

from django.conf import settings
from django.db import connection

from sessions_app.llm.abort import CANCELLED, SUPERSEDED, Abort
from sessions_app.models import Session

logger = logging.getLogger(__name__)


class _StopWatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[uuid.UUID, Abort, int | None]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, session_id: uuid.UUID, abort: Abort, gen: int | None = None) -> Iterator[Abort]:
        """Set `abort` if the session's turn is cancelled (CANCELLED) or, given
        the caller's lease generation `gen`, the lease moves on (SUPERSEDED)
        while the block runs."""
        key = id(abort)
        with self._lock:
            idle = not self._calls
            self._calls[key] = (session_id, abort, gen)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="terret-stop-watch", daemon=True)
                self._thread.start()
        if idle:
            self._wake.set()  # the first call after an idle spell: the watch starts a full interval
        try:
            yield abort
        finally:
            with self._lock:
                self._calls.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                active = bool(self._calls)
            if not active:
                self._wake.wait()
                self._wake.clear()
                continue
            # One read per interval for every call in flight; a call that
            # starts the process's activity restarts the interval.
            if self._wake.wait(settings.TERRET_CANCEL_POLL_SECONDS):
                self._wake.clear()
                continue
            with self._lock:
                calls = list(self._calls.values())
            try:
                self._poll(calls)
            except Exception:
                logger.exception("polling %d model calls for cancels failed", len(calls))
            finally:
                connection.close()

    def _poll(self, calls: list[tuple[uuid.UUID, Abort, int | None]]) -> None:
        ids = {sid for sid, _, _ in calls}
        rows = Session.objects.filter(id__in=ids).values_list("id", "cancel_seq", "lease_gen")
        now = {sid: (cancel_seq, lease_gen) for sid, cancel_seq, lease_gen in rows}
        for sid, abort, gen in calls:
            cancel_seq, lease_gen = now.get(sid, (None, gen))
            if cancel_seq is not None:
                abort.set(CANCELLED)
            elif gen is not None and lease_gen != gen:
                abort.set(SUPERSEDED)


stop_watch = _StopWatch()
