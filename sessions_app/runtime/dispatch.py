"""Waking a worker for a session, after commit.

A wake-up carries only the session id: the worker reads what to do from the
log, so a lost, duplicated or late wake-up is harmless (the lease serializes
drivers and the sweep recovers anything a lost message left behind).

With Celery the wake-up is sent by task name: the task module
(sessions_app/tasks.py) is a thin adapter above the runtime, and the runtime
does not import it.
"""

from __future__ import annotations

import uuid

from celery import current_app
from django.conf import settings
from django.db import transaction

from sessions_app.runtime import inprocess

DRIVE_TASK = "terret.drive_session"
SWEEP_TASK = "terret.sweep"


def wake(session_id: uuid.UUID | str) -> None:
    """Schedule a drive of the session once the current transaction commits."""
    sid = str(session_id)
    if settings.TERRET_WORKER == "manual":
        return
    if settings.TERRET_WORKER == "celery":
        transaction.on_commit(lambda: send_drive(sid))
    else:
        transaction.on_commit(lambda: inprocess.submit(sid))


def send_drive(session_id: str) -> None:
    current_app.send_task(DRIVE_TASK, args=[session_id])
