"""Post-turn work: titling and the compaction trigger.

Only the turn runner appends turn/end, so the worker that drove a turn runs
post_turn() itself right after releasing the session's lease (runtime.loop.
drive; not in manual mode, where tests call it themselves). That costs no
second task and no listener. post_turn() reads everything it needs from the
log and is safe to run twice, so a worker dying before it runs costs at most
a late title (the next turn/end titles the session) or a compaction that the
next overweight turn retries.
"""

from __future__ import annotations

import logging
import uuid

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
