"""Post-turn work: titling, the compaction trigger, and handing the freed
agent slot to a session waiting for one (runtime/registry.py).

Only the turn runner appends turn/end, so the worker that drove a turn runs
this itself, as an after-turn hook (runtime.hooks, registered in
sessions_app/apps.py), right after releasing the session's lease; not in
manual mode, where tests call post_turn() themselves. That costs no second
task and no listener. The runner hands over what it already knows
(TurnFacts: the profile, whether the session had a title when the lease was
claimed, the first user text, the last step's prompt tokens, and whether
any session waits for an agent slot, which the turn's releasing commit read
in the same statement: log/runs.py SLOTS_WANTED), so a titled session under
its budget, with nobody waiting, costs no query at all: offer_slots() and its
has_waiting() query run only when the facts do not say False. Without facts, post_turn()
reads everything from the log. Either way it is safe to run twice, so a
worker dying before it runs costs at most a late title (the next turn/end
titles the session) or a compaction that the next overweight turn retries.
"""

from __future__ import annotations

import logging
import uuid

from sessions_app.models import Session
from sessions_app.runtime import dispatch, registry
from sessions_app.runtime.hooks import TurnFacts
from sessions_app.services import compaction, titling

logger = logging.getLogger(__name__)


def post_turn(session_id: uuid.UUID | str, facts: TurnFacts | None = None) -> None:
    """Hand the slot on, title the session if it has none, compact it if the
    last step was over budget. Each part's failure is isolated from the others."""
    try:
        if facts is None or facts.slots_wanted is not False:
            for waiting in registry.offer_slots():
                dispatch.wake(waiting)
    except Exception:
        logger.exception("handing agent slots on after %s failed", session_id)
    if facts is None and not Session.objects.filter(id=session_id).exists():
        return  # gone (a stale task from a flushed test database, say)
    if facts is None or not facts.titled:
        try:
            if facts is None:
                titling.ensure_title(session_id)
            else:
                titling.ensure_title(
                    session_id, profile=facts.profile, user_text=facts.first_user_text, overrides=facts.overrides
                )
        except Exception:
            logger.exception("titling %s failed", session_id)
    if facts is not None and facts.over_budget is False:
        return
    try:
        compaction.maybe_compact(session_id)
    except Exception:
        logger.exception("the compaction trigger failed for %s", session_id)
