"""Sentences and labels for people, shared by the pages and the admin (both
doors of a kind, so neither borrows from the other): a status as words, and
what a manual compaction did."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.sessions import compact
from sessions_app.errors import NotAllowed, TerretError, UnknownSession

STATUS_LABELS = {
    "idle": "idle",
    "running": "running",
    "waiting_approval": "waiting for approval",
    "waiting_task": "waiting for its tasks",
    "waiting_reconcile": "waiting for an operator",
    "suspended": "suspended by an operator",
    "revoked": "revoked",
    "blocked": "blocked",
}


def status_label(status: str) -> str:
    return STATUS_LABELS.get(status, status)


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
