"""The embedded worker: a thread pool inside the web process.

Used when there is no Redis (the default for `make run`). It runs exactly the
code a Celery worker runs (drive.drive) and the same periodic sweep, so the
durability story is the same: the database is the truth and a crash of the
process is recovered by the sweep when it starts again. On PostgreSQL the
process also holds its liveness lock (liveness.py), so another process's
sweep or poller takes its turns over as soon as it dies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connection

from sessions_app.runtime import lifecycle, liveness
from sessions_app.runtime.drive import drive
from sessions_app.runtime.sweep import sweep_round

log = logging.getLogger(__name__)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_queued: set[str] = set()
_sweeper: threading.Thread | None = None


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="terret-turn")
        return _pool


def submit(session_id: str) -> None:
    with _lock:
        if session_id in _queued:
            return  # a drive is already queued; it will read everything new
        _queued.add(session_id)
    _get_pool().submit(_run, session_id)


_task_runner: list[Callable[[str], None]] = []


def use_task_runner(runner: Callable[[str], None]) -> None:
    """How this process runs an owned task (runtime/owned/supervise.start)."""
    _task_runner[:] = [runner]


def submit_task(task_id: str) -> None:
    for runner in _task_runner:
        runner(task_id)


def _run(session_id: str) -> None:

    with _lock:
        _queued.discard(session_id)
    try:
        drive(session_id)
    except Exception:
        log.exception("in-process drive of %s failed", session_id)
    finally:
        connection.close()


def start_sweeper() -> None:
    """Take the liveness lock (PostgreSQL), then sweep once now and every
    TERRET_SWEEP_SECONDS (idempotent)."""
    global _sweeper
    try:
        liveness.start(_wake)
    except Exception:
        log.exception("liveness did not start; this process's leases are freed by their expiry only")
    with _lock:
        if _sweeper is not None and _sweeper.is_alive():
            return
        _sweeper = threading.Thread(target=_sweep_forever, name="terret-sweeper", daemon=True)
        _sweeper.start()


def _wake(session_id: str) -> None:
    # Re-read each time: tests switch the worker mode at run time.
    if settings.TERRET_WORKER == "inprocess":
        submit(session_id)


def _sweep_forever() -> None:
    stop = threading.Event()
    first = True
    while not stop.is_set():
        # Re-read each round: tests switch the worker mode at run time.
        if settings.TERRET_WORKER == "inprocess" and not lifecycle.draining.is_set():
            _sweep_round(first)
            first = False
        stop.wait(settings.TERRET_SWEEP_SECONDS)


def _sweep_round(first: bool) -> None:
    sweep_round(at_start=first, wake=submit)
