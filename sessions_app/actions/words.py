"""Sentences and labels for people, shared by the pages and the admin (both
doors of a kind, so neither borrows from the other): a status as words, and
what a manual compaction did."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.sessions import compact
from sessions_app.errors import NotAllowed, TerretError, UnknownSession
from sessions_app.log.reads import stall_stands
from sessions_app.runtime import limits

STATUS_LABELS = {
    "idle": "idle",
    "running": "running",
    "waiting_approval": "waiting for approval",
    "waiting_task": "waiting for a task",
    "waiting_reconcile": "waiting for an operator",
    "suspended": "suspended by an operator",
    "revoked": "revoked",
    "blocked": "blocked",
}


def status_label(status: str) -> str:
    return STATUS_LABELS.get(status, status)


def shown_state(session: Any) -> tuple[str, str]:
    """(css class, words) of what a session is doing, for badges and tables.

    `Session.status` reads "idle" whenever no turn is open, which hides an
    operator's hold, a budget holding input, or a turn owed but not yet taken
    by a worker; people read this instead (docs/protocol.md, "States as shown").
    Read from the session row alone (no query)."""
    status = session.status
    if session.revoked_seq is not None:
        return "revoked", "revoked"
    if session.suspended_seq is not None:
        return "suspended", "held (suspended)"
    if status != "idle":
        if status == "running":
            if stall_stands(session):
                return "stalled", "stalled"
            if not session.lease_owner:
                return "waiting_worker", "waiting for a worker"
        return status, status_label(status)
    if session.held_seq is not None:
        return ("suspended", "held (suspended)") if _suspended_above(session) else ("held", "held (budget)")
    if session.waiting_seq is not None:
        return "waiting_worker", "waiting for an agent slot"
    # Owed a turn (the sweep's owed(), runtime/sweep.py): a task is queued or about to be.
    if session.queued_follow_ups > 0 or (session.woken_steers > 0 and session.last_input_seq > session.inbox_seq):
        return "waiting_worker", "waiting for a worker"
    return "idle", "idle"


def _suspended_above(session: Any) -> bool:
    """Whether a profile or global suspension holds the session's input (a
    cached read, limits.suspensions; the profile's name is read only while
    some profile is suspended)."""
    found = limits.suspensions()
    if not found:
        return False
    if ("global", "") in found:
        return True
    profile = session.profile if session.profile_id is not None else None
    return profile is not None and ("profile", profile.name) in found


def compact_outcome(user: Any, session_id: Any) -> tuple[bool, str]:
    """(compacted?, a sentence for the user), from the `compact` verb. Its
    access refusals propagate; a failure of the summarizer is a sentence."""
    try:
        outcome = compact(user, session_id)
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:  # the compactor role is unconfigured or its model failed
        return False, f"Compaction failed: {exc}"
    if outcome.compacted:
        return True, f"Compacted: events up to #{outcome.upto_seq} are now summarized for the model."
    return False, f"Compaction declined: {outcome.reason}."
