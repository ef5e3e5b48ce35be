"""Post-turn work: titling and the compaction trigger.

Only the turn runner appends turn/end, so the worker that drove a turn runs
post_turn() itself right after releasing the session's lease (runtime.loop.
drive; not in manual mode, where tests call it themselves). That costs no
second task and no listener. The runner hands over what it already knows
(TurnFacts: the profile, whether the session had a title when the lease was
claimed, the first user text, the last step's prompt tokens), so a titled
session under its budget costs no query at all. Without facts, post_turn()
reads everything from the log. Either way it is safe to run twice, so a
worker dying before it runs costs at most a late title (the next turn/end
titles the session) or a compaction that the next overweight turn retries.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessions_app.models import AgentProfile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnFacts:
    """What the runner of a turn that just ended knows about its session.
    `titled` may be stale in one direction only (a title landed since the
    claim), which the guarded title append absorbs."""

    profile: AgentProfile
    titled: bool
    first_user_text: str | None = None
    last_prompt_tokens: int | None = None
    overrides: dict[str, str] = field(default_factory=dict)

    @property
    def over_budget(self) -> bool | None:
        """None when the turn saw no step usage (the log decides then)."""
        if self.last_prompt_tokens is None:
            return None
        budget = self.profile.compaction_budget
        return bool(budget) and self.last_prompt_tokens >= budget


def post_turn(session_id: uuid.UUID | str, facts: TurnFacts | None = None) -> None:
    """Title the session if it has none; compact it if the last step was over
    budget. Each part's failure is isolated from the other."""
    from sessions_app import compaction, titling
    from sessions_app.models import Session

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
