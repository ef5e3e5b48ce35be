"""Waking a worker for a session, after commit.

A wake-up carries only the session id: the worker reads what to do from the
log, so a lost, duplicated or late wake-up is harmless (the lease serializes
drivers and the sweep recovers anything a lost message left behind).

With Celery the wake-up is sent by task name: the task module
(sessions_app/tasks.py) is a thin adapter above the runtime, and the runtime
does not import it.

A wake-up is sent after the input it serves has committed, so a broker that
is down must not turn accepted input into an error: the send failing is
logged, and the session is remembered and re-sent by a retry thread once
the broker answers again (a crash meanwhile leaves it to the sweep, which
finds every open turn nobody drives).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from celery import current_app
from django.conf import settings
from django.db import transaction

from sessions_app.runtime import inprocess

DRIVE_TASK = "terret.drive_session"
SWEEP_TASK = "terret.sweep"
RUN_TASK = "terret.run_task"  # an owned task's supervision (runtime/owned/supervise.py)


def wake(session_id: uuid.UUID | str) -> None:
    """Schedule a drive of the session once the current transaction commits."""
    sid = str(session_id)
    if settings.TERRET_WORKER == "manual":
        return
    if settings.TERRET_WORKER == "celery":
        transaction.on_commit(lambda: send_drive(sid))
    else:
        transaction.on_commit(lambda: inprocess.submit(sid))


def start_task(task_id: str) -> None:
    """Start an owned task's supervision: on a Celery worker, or on a thread
    of this process (the embedded worker). Called after commit (the store
    schedules it with transaction.on_commit); a lost start is restarted by
    the reaper once its task is a lease old."""
    if settings.TERRET_WORKER == "manual":
        return
    if settings.TERRET_WORKER == "celery":
        try:
            current_app.send_task(RUN_TASK, args=[task_id])
        except Exception as exc:
            logger.warning("start of task %s not sent (%s); the reaper starts it again", task_id, exc)
    else:
        inprocess.submit_task(task_id)


logger = logging.getLogger(__name__)
RESEND_SECONDS = 1.0


def send_drive(session_id: str, *, countdown: float | None = None) -> None:
    """Send a drive task (due `countdown` seconds from now); never raises (see the module docstring)."""
    try:
        # The send time rides along, so the worker can count the queue wait.
        current_app.send_task(DRIVE_TASK, args=[session_id, time.time()], countdown=countdown)
    except Exception as exc:
        logger.warning("wake-up for %s not sent (%s); retrying in the background", session_id, exc)
        _resend.add(session_id)


class _Resend:
    """Sessions whose wake-up the broker refused, re-sent until it takes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._thread: threading.Thread | None = None

    def add(self, session_id: str) -> None:
        with self._lock:
            self._pending.add(session_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="terret-wake-resend", daemon=True)
                self._thread.start()

    def pending(self) -> set[str]:
        with self._lock:
            return set(self._pending)

    def _run(self) -> None:
        stop = threading.Event()
        while True:
            stop.wait(RESEND_SECONDS)
            with self._lock:
                batch = sorted(self._pending)
                if not batch:
                    self._thread = None  # under the lock: add() starts a new one
                    return
            for sid in batch:
                try:
                    current_app.send_task(DRIVE_TASK, args=[sid, time.time()])
                except Exception:
                    break  # still down; try again after the pause
                with self._lock:
                    self._pending.discard(sid)


_resend = _Resend()
