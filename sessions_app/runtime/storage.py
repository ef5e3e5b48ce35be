"""Storage tiering's verbs and the policy-driven mover (docs/storage.md).

`set_tier` moves one session cold or hot under its row lock (log/tiering.py
does the moving); `move_quiet`, a part of every sweep round, moves the
sessions that their profile's `cold_after_days` says are quiet, and deletes
the archives `delete_cold_after_days` says are old, a bounded batch a round.

Only a quiet session moves cold: no open turn, no pending approval, no
input waiting. A cold session needs nothing of a worker until someone
touches it, and the touch (a door, any locked write) reads it back.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.db.models import F
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import InvalidInput, StorageBusy
from sessions_app.log import tiering
from sessions_app.models import AgentProfile, ColdSegment, Session

logger = logging.getLogger(__name__)

TIERS = ("hot", "cold")
MOVE_BATCH = 20


def storage_of(session: Session) -> dict[str, Any]:
    """What GET /api/sessions/{id} shows: the log's events and payload bytes
    (hot and cold alike), its tier, and a cold archive's stored bytes."""
    out: dict[str, Any] = {"events": session.last_seq, "bytes": session.log_bytes, "tier": session.storage_tier}
    if session.storage_tier == "cold":
        stored = ColdSegment.objects.filter(session_id=session.id, deleted_at__isnull=True).values_list(
            "stored_bytes", flat=True
        )
        out["stored_bytes"] = sum(stored)
    return out


def _busy(row: dict[str, Any]) -> str | None:
    if row["open_turn_seq"] is not None:
        return "a turn is open"
    if row["pending_approvals"] > 0 or row["unknown_effects"] > 0:
        return "a call waits for a decision"
    if row["last_input_seq"] > row["inbox_seq"] or row["deferred_seq"] > row["deferred_cursor"]:
        return "input waits"
    return None


def set_tier(session_id: uuid.UUID | str, tier: Any, *, by: str) -> str:
    """Move the session to `tier` ("hot" or "cold"); the tier it is in after.
    Moving it where it is already changes nothing. Cold needs a quiet
    session (StorageBusy otherwise, nothing changed)."""
    if tier not in TIERS:
        raise InvalidInput(f"tier must be one of {', '.join(TIERS)}")
    with log.locked(session_id, thaw=False) as tx:
        current = tx.row["storage_tier"]
        if tier == "hot":
            if current == "cold":
                tiering.thaw_in(tx, by=by)
                return "hot"
            return str(current)
        if current == "cold":
            return "cold"
        why = _busy(tx.row)
        if why is not None:
            raise StorageBusy(f"session {tx.session_id} cannot move cold now: {why}")
        tiering.freeze_in(tx, by=by)
        return "cold"


def ensure_hot(session_id: uuid.UUID | str) -> bool:
    """Read a cold session back (a door's touch); whether it was cold."""
    if not Session.objects.filter(id=session_id, storage_tier="cold").exists():
        return False
    with log.locked(session_id):  # locked thaws a cold session
        pass
    return True


def move_quiet() -> list[str]:
    """One sweep round's tiering: quiet sessions of profiles with
    cold_after_days moved cold, and cold archives past delete_cold_after_days
    deleted; at most MOVE_BATCH of each. Wakes nobody."""
    now = timezone.now()
    for profile_id, days in AgentProfile.objects.filter(cold_after_days__isnull=False).values_list(
        "id", "cold_after_days"
    ):
        quiet = Session.objects.filter(
            profile_id=profile_id,
            storage_tier="hot",
            open_turn_seq__isnull=True,
            pending_approvals=0,
            unknown_effects=0,
            last_event_at__lt=now - timedelta(days=days or 0),
            last_input_seq__lte=F("inbox_seq"),
            deferred_seq__lte=F("deferred_cursor"),
        )
        for sid in quiet.values_list("id", flat=True)[:MOVE_BATCH]:
            try:
                set_tier(sid, "cold", by="policy")
            except StorageBusy:
                continue  # touched meanwhile: the next round looks again
    for profile_id, days in AgentProfile.objects.filter(delete_cold_after_days__isnull=False).values_list(
        "id", "delete_cold_after_days"
    ):
        old = ColdSegment.objects.filter(
            session__profile_id=profile_id,
            session__storage_tier="cold",
            deleted_at__isnull=True,
            created_at__lt=now - timedelta(days=days or 0),
        )
        for sid in old.values_list("session_id", flat=True).distinct()[:MOVE_BATCH]:
            with log.locked(sid, thaw=False) as tx:
                if tx.row["storage_tier"] == "cold":
                    tiering.delete_cold_in(tx, by="policy")
    return []
