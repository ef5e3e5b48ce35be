"""Session-event listeners registered at startup (see SessionsAppConfig.ready).

turn/end -> post-turn work (titling, the compaction trigger). Listeners run in
the appending thread (often a turn worker), so the listener only hands the
session id to a worker: a Celery task (`terret.post_turn`) when
TERRET_WORKER=celery, the in-process pool when inprocess, nothing when manual
(tests drive that work themselves). post_turn() reads everything it needs
from the log and is safe to run twice, so a lost or duplicated hand-off costs
at most a late title or one more compaction check at the next turn/end.
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings

from sessions_app.log import AppendedEvent, on_event

logger = logging.getLogger(__name__)


def post_turn(session_id: uuid.UUID | str) -> None:
    """Title the session if it has none; compact it if the last step was over
    budget. Each part's failure is isolated from the other."""
    from sessions_app import compaction, titling
    from sessions_app.models import Session

    if not Session.objects.filter(id=session_id).exists():
        return  # gone (a stale task from a flushed test database, say)
    try:
        titling.ensure_title(session_id)
    except Exception:
        logger.exception("titling %s failed", session_id)
    try:
        compaction.maybe_compact(session_id)
    except Exception:
        logger.exception("the compaction trigger failed for %s", session_id)


def dispatch_post_turn(session_id: uuid.UUID | str) -> None:
    """Hand post_turn to a worker; never runs it in the calling thread."""
    sid = str(session_id)
    if settings.TERRET_WORKER == "celery":
        from sessions_app.tasks import post_turn_task

        post_turn_task.delay(sid)
    elif settings.TERRET_WORKER == "inprocess":
        from sessions_app.runtime import inprocess

        inprocess.submit_call(post_turn, sid)


@on_event("turn/end")
def _after_turn(event: AppendedEvent) -> None:
    dispatch_post_turn(event.session_id)
