"""Waking a worker for a session, after commit.

A wake-up carries only the session id: the worker reads what to do from the
log, so a lost, duplicated or late wake-up is harmless (the lease serializes
drivers and the sweep recovers anything a lost message left behind).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import transaction


def wake(session_id: uuid.UUID | str) -> None:
    """Schedule a drive of the session once the current transaction commits."""
    sid = str(session_id)
    if settings.TERRET_WORKER == "manual":
        return
    if settings.TERRET_WORKER == "celery":
        from sessions_app.tasks import drive_session

        drive_session.delay_on_commit(sid)  # type: ignore[attr-defined]  # DjangoTask; celery-types lacks it
    else:
        from sessions_app.runtime import inprocess

        transaction.on_commit(lambda: inprocess.submit(sid))
