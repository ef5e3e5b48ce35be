"""Driving a session: what a worker runs for a wake-up.

`drive(session_id)` claims the session's lease, opens a turn from woken
input if the agent is idle, and runs (or resumes) the open turn (runner.py)
until it ends, parks on an approval, or loses its lease. All state comes
from the log, so a fresh worker after a kill -9 continues exactly where
the dead one's last commit left off. Every append is fenced on the lease.
"""

from __future__ import annotations

import uuid

from django.conf import settings

from sessions_app import log
from sessions_app.errors import LeaseLost
from sessions_app.log.records import Workload
from sessions_app.runtime import admission, hooks
from sessions_app.runtime import lease as leases
from sessions_app.runtime.outcomes import Outcome
from sessions_app.runtime.runner import TurnRunner

RESUME_BACKOFF_SECONDS = 30.0
MAX_ROUNDS = 100


def drive(session_id: uuid.UUID | str) -> Outcome:
    """Drive a session until nothing is owed; returns what happened last."""
    sid = uuid.UUID(str(session_id))
    ended: hooks.TurnFacts | None = None
    try:
        outcome, ended = _drive(sid)
    finally:
        if ended is not None and settings.TERRET_WORKER != "manual":
            hooks.run_after_turn(sid, ended)
    return outcome


def _drive(sid: uuid.UUID) -> tuple[Outcome, hooks.TurnFacts | None]:
    outcome = Outcome.IDLE
    ended: hooks.TurnFacts | None = None
    # Re-check after releasing: a wake-up that arrived while we held the lease
    # found it busy and left, so its work is ours to notice. PARKED is not
    # final for the same reason: a verdict may have landed meanwhile.
    for _ in range(MAX_ROUNDS):
        lease = leases.claim(sid)
        if lease is None:
            return Outcome.BUSY, ended
        left: Workload | None = None
        runner: TurnRunner | None = None
        try:
            outcome, runner = _drive_with_lease(sid, lease)
        except LeaseLost:
            outcome = Outcome.LOST
        finally:
            if runner is not None and runner.outbox.released is not None:
                left = runner.outbox.released  # its last commit gave the lease up
            else:
                retry_after = RESUME_BACKOFF_SECONDS if outcome is Outcome.RESUME_FAILED else None
                left = leases.release(lease, retry_after=retry_after)
        if outcome is Outcome.ENDED and runner is not None:
            ended = runner.facts()
        if outcome in (Outcome.LOST, Outcome.RESUME_FAILED, Outcome.NO_AGENT) or left is None:
            return outcome, ended
        if not has_work(sid, left):
            return outcome, ended
    return outcome, ended


def has_work(session_id: uuid.UUID, workload: Workload) -> bool:
    if workload.open_turn_seq is not None:
        return workload.pending_approvals == 0
    if not workload.input_pending:
        return False
    return admission.has_woken_input(session_id, workload.inbox_seq)


def _drive_with_lease(sid: uuid.UUID, lease: leases.Lease) -> tuple[Outcome, TurnRunner | None]:
    profile = lease.driving.profile
    if profile is None:
        return Outcome.NO_AGENT, None
    turn_seq = lease.workload.open_turn_seq
    if turn_seq is None:
        if not lease.workload.input_pending:
            return Outcome.IDLE, None
        with log.locked(sid, fence=lease.fence) as tx:
            if not admission.has_woken_input(sid, tx.row["inbox_seq"]):
                return Outcome.IDLE, None
            turn_seq = admission.open_turn(tx, None, "")
            # The row as the turn opens, not as claimed: a policy or model
            # change in between precedes the turn, so the load would not see it.
            lease.driving = leases.driving_from_row(profile, tx.row)
    runner = TurnRunner(sid, profile, lease)
    return runner.run(turn_seq), runner
