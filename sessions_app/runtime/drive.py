"""Driving a session: what a worker runs for a wake-up.

`drive(session_id)` claims the session's lease, spawns its agent if it has
none (registry.py), opens a turn from woken input if the agent is idle, and
runs (or resumes) the open turn (runner.py) until it ends, parks on an
approval, is blocked, or loses its lease. All state comes from the log, so a
fresh worker after a kill -9 continues exactly where the dead one's last
commit left off. Every append is fenced on the lease.

A database outage (a restart, a dropped connection) is not the turn's
failure: the drive gives its lease back as soon as the database answers
again and drives once more from the log, retrying with backoff for
TERRET_DB_RETRY_SECONDS, so a restart stalls a turn by about its own length.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace

from django.conf import settings

from sessions_app import log
from sessions_app.errors import LeaseLost, NoProfile
from sessions_app.log.reads import first_waiting, turn_events
from sessions_app.log.records import Workload
from sessions_app.runtime import admission, codever, failures, hooks, lifecycle, limits, registry, versions
from sessions_app.runtime import lease as leases
from sessions_app.runtime.closing import closing_entries
from sessions_app.runtime.outcomes import Outcome
from sessions_app.runtime.runner import TurnRunner

logger = logging.getLogger(__name__)

MAX_ROUNDS = 100
DB_RETRY_FIRST_SECONDS = 0.25
DB_RETRY_MAX_SECONDS = 2.0


def drive(session_id: uuid.UUID | str) -> Outcome:
    """Drive a session until nothing is owed; returns what happened last.
    HANDED_OFF (the process is draining) means the caller should wake
    another worker for the session."""
    sid = uuid.UUID(str(session_id))
    if lifecycle.draining.is_set():
        return Outcome.HANDED_OFF  # claim nothing new while the process stops
    ended: hooks.TurnFacts | None = None
    try:
        outcome, ended = _drive_retrying(sid)
    finally:
        if ended is not None and settings.TERRET_WORKER != "manual":
            hooks.run_after_turn(sid, ended)
    return outcome


class _Held:
    """The lease a round holds, so a database outage can give it back."""

    lease: leases.Lease | None = None


def _drive_retrying(sid: uuid.UUID) -> tuple[Outcome, hooks.TurnFacts | None]:
    held = _Held()
    deadline = time.monotonic() + settings.TERRET_DB_RETRY_SECONDS
    delay = DB_RETRY_FIRST_SECONDS
    while True:
        try:
            if held.lease is not None:
                leases.release(held.lease)  # ours still: hand it back before claiming afresh
                held.lease = None
            return _drive(sid, held)
        except Exception as exc:
            if not failures.is_database_outage(exc) or time.monotonic() + delay > deadline:
                raise
            logger.warning("drive of %s: database unavailable (%s); retrying in %.2fs", sid, exc, delay)
            failures.drop_dead_connections()
            time.sleep(delay)
            delay = min(delay * 2, DB_RETRY_MAX_SECONDS)


def _drive(sid: uuid.UUID, held: _Held | None = None) -> tuple[Outcome, hooks.TurnFacts | None]:
    held = held or _Held()
    outcome = Outcome.IDLE
    ended: hooks.TurnFacts | None = None
    # Re-check after releasing: a wake-up that arrived while we held the lease
    # found it busy and left, so its work is ours to notice. PARKED is not
    # final for the same reason: a verdict may have landed meanwhile.
    for _ in range(MAX_ROUNDS):
        lease = leases.claim(sid)
        if lease is None:
            return Outcome.BUSY, ended
        held.lease = lease
        left: Workload | None = None
        runner: TurnRunner | None = None
        try:
            outcome, runner = _drive_with_lease(sid, lease)
        except LeaseLost:
            outcome = Outcome.LOST
        except Exception as exc:
            if not failures.is_database_outage(exc):  # an outage's release waits for the database
                held.lease = None
                leases.release(lease)
            raise
        if runner is not None and runner.outbox.released is not None:
            left = runner.outbox.released  # its last commit gave the lease up
        elif outcome is not Outcome.LOST:
            retry_after = runner.retry_after if runner is not None else None
            left = leases.release(lease, retry_after=retry_after)
        held.lease = None
        if outcome is Outcome.ENDED and runner is not None:
            ended = runner.facts()
        if outcome in _FINAL or left is None or not has_work(sid, left):
            return outcome, ended
    return outcome, ended


_FINAL = (
    Outcome.LOST,
    Outcome.RESUME_FAILED,
    Outcome.BLOCKED,
    Outcome.HANDED_OFF,
    Outcome.LEFT,
    Outcome.WAITING,
    Outcome.SUSPENDED,
)


def _unreadable(sid: uuid.UUID, lease: leases.Lease, what: str) -> Outcome:
    """The log holds an event version this code does not read (`what`):
    drive nothing (the caller releases the lease). A live worker that reads
    it gets the session (LEFT: the task wakes one again); with none,
    an open turn is blocked unsupported_version and waits whole for one, and
    queued input waits as it is (runtime/codever.py)."""
    if codever.capable_worker(lease.driving.event_versions):
        logger.info("session %s holds %s, newer than this worker reads: left to one that does", sid, what)
        return Outcome.LEFT
    logger.warning("session %s holds %s and no live worker reads it: blocked", sid, what)
    if lease.workload.open_turn_seq is not None:
        codever.block(sid, lease.fence, what)
    return Outcome.BLOCKED


def has_work(session_id: uuid.UUID, workload: Workload) -> bool:
    if workload.open_turn_seq is not None:
        return (
            workload.pending_approvals == 0
            and workload.blocked_seq is None
            and workload.unknown_effects == 0
            and workload.waiting_tasks == 0  # parked on owned tasks: their receipts wake it
        )
    if not workload.input_pending:
        return False
    return admission.has_woken_input(session_id, workload.inbox_seq, follow_ups=workload.queued_follow_ups)


def _drive_with_lease(sid: uuid.UUID, lease: leases.Lease) -> tuple[Outcome, TurnRunner | None]:
    workload = lease.workload
    if workload.open_turn_seq is not None and workload.blocked_seq is not None:
        return Outcome.BLOCKED, None  # a stray wake-up: a blocked turn waits for a stimulus
    if lease.driving.event_versions and (what := codever.unreadable(lease.driving.event_versions)):
        return _unreadable(sid, lease, what), None
    if workload.open_turn_seq is None and not workload.input_pending:
        return Outcome.IDLE, None
    if lease.driving.profile is None:
        outcome = _spawn(sid, lease)
        if outcome is not None:
            return outcome, None
    profile = lease.driving.profile
    assert profile is not None
    turn_seq = workload.open_turn_seq
    opened: admission.Opened | None = None
    if turn_seq is None:
        over: limits.Stop | None = limits.hold_of(profile, suspended=lease.driving.suspended)
        if lease.driving.revoked:
            return Outcome.IDLE, None  # its input was refused; nothing queued before it starts
        if over is None:
            over = limits.check(
                sid, profile, opening=True, budgeted=lease.driving.budgeted, parent=lease.driving.parent
            )
        if over is not None:
            hold_input(sid, lease, over)
            return Outcome.IDLE, None
        try:
            with log.locked(sid, fence=lease.fence) as tx:
                if not admission.has_woken_input(sid, tx.row["inbox_seq"], follow_ups=tx.row["queued_follow_ups"]):
                    return Outcome.IDLE, None
                opened = admission.open_taking(tx, None, "")
                turn_seq = opened.seq
                # The row as the turn opens, not as claimed: a policy or model
                # change in between precedes the turn, so the load would not see it.
                lease.driving = leases.driving_from_row(profile, tx.row)
        except log.TurnAlreadyOpen:
            # Admission opened a turn since the claim (the web process needs no
            # lease for that): the woken input queues behind it, and the
            # release's workload names the open turn, so the next round drives it.
            return Outcome.IDLE, None
    # The turn runs under the version its turn/start names, whatever the
    # profile's row says now: an edit reaches only the turns opened after it.
    version = opened.version if opened is not None else lease.driving.version
    runner = TurnRunner(sid, versions.profile_at(profile, version), lease)
    if opened is not None:
        runner.steers_left = opened.steers_left
    return runner.run(turn_seq), runner


def hold_input(sid: uuid.UUID, lease: leases.Lease, over: limits.Stop) -> None:
    """Woken input that a budget keeps from starting a turn stays queued,
    visibly held (input/held, once until a turn takes it in); the sweep
    offers it again, and a raised budget wakes it."""
    with log.locked(sid, fence=lease.fence) as tx:
        if tx.row["held_seq"] is not None:
            return
        woken = first_waiting(sid, "input/queued", tx.row["inbox_seq"], wake=True)
        if woken is None and tx.row["queued_follow_ups"] > 0:
            woken = first_waiting(sid, "input/deferred", tx.row["deferred_cursor"], lane="follow_up")
        if woken is not None:
            tx.append("input/held", {"source_seq": woken, "reason": over.as_json(), "text": over.message})


def _spawn(sid: uuid.UUID, lease: leases.Lease) -> Outcome | None:
    """Give the session a live agent; an Outcome when the drive cannot go on."""
    try:
        profile = registry.ensure_agent(sid, lease.fence)
    except NoProfile as exc:
        logger.warning("drive of %s: %s", sid, exc)
        if lease.workload.open_turn_seq is None:
            return Outcome.IDLE  # its input stays queued; nothing could run it
        _close_failed(sid, lease, str(exc))
        return Outcome.ENDED
    if profile is None:
        return Outcome.WAITING
    lease.driving = replace(lease.driving, profile=profile)
    lease.view = None  # the claim's view predates agent/spawned
    return None


def _close_failed(sid: uuid.UUID, lease: leases.Lease, error: str) -> None:
    with log.locked(sid, fence=lease.fence) as tx:
        events = turn_events(sid, tx.row["open_turn_seq"])
        for kind, data in closing_entries(events, "failed", error=error, owed=f"failed: {error}"):
            tx.append(kind, data)
