"""Scheduled wake-ups: the clock that claims due schedules and fires them.

Every worker process (Celery's and the in-process one) runs a clock thread
that calls `tick()` every TERRET_SCHEDULE_POLL_SECONDS, then the clocks the
apps registered (runtime.hooks.register_clock: the approval clock). A tick works in
rounds: a round reads the due schedules fairly (a bounded share per session
and per owner, every owner's earliest first: `_round`), then claims them one
at a time with `SELECT ... FOR UPDATE SKIP LOCKED`, so workers claim
disjoint rows and none waits on another's claim; and it fires each schedule
inside the same transaction as its claim: the session's follow-up
input, its `schedule/fired` event and the schedule's advance (runs, next due
time, generation) commit together or not at all. A worker killed mid-claim
leaves the row pending for the next tick; a schedule can never fire twice for
one due time, and nothing waits on a timer in a broker (no Celery ETA or
countdown, whose messages a broker re-delivers past its visibility timeout).
The row lock is the claim, so `claimed` is never seen committed; `generation`
counts the claims.

Before each firing the clock checks again what may have changed since the
schedule was made: the session revoked or archived, or its owner's account
deactivated (the schedule is cancelled, `owner_inactive`), its expires_at
passed or its runs at max_runs (it is completed: a recurring schedule is
bounded by default, services/schedules.py), an operator's suspension, a
budget, the profile's bounds, the schedule's own token budget (the firing is skipped, and why is recorded),
the previous run's input still waiting (coalesced: one pending follow-up per
schedule), and the runs so far: after `schedule_pause_after` consecutive
runs whose turns ended empty, failed or rejected it pauses itself.

A row that cannot be fired (an impossible due time written by SQL, read
back clamped; any error but a database outage) is marked failed, once, and
the round goes on: no row can stop the clock for everyone.

Misfires: a due time more than TERRET_SCHEDULE_GRACE_SECONDS in the past (the
workers were down) follows the schedule's policy: `skip` drops the missed
due times, `run_once` fires once for all of them and keeps the recurrence's
phase, `reschedule` fires once and restarts the recurrence from now.

The timing itself (what a due time that came means under the misfire
policy, the next due time after a run or a skip, the bounds: expiry and
max_runs) is the functions under "timing", which read only a row's timing
fields (`Timed`): a monitor's periods (sessions_app/monitors/run.py) are
timed by the same functions, so the two cannot drift apart.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from cronsim import CronSim
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from sessions_app import log
from sessions_app.log.reads import input_fate, turn_events, turn_start_before
from sessions_app.models import DUE_READ_MAX, Schedule, Session, due_unreadable
from sessions_app.runtime import admission, dispatch, hooks, lifecycle, limits
from sessions_app.runtime.failures import is_database_outage

logger = logging.getLogger(__name__)

LIVE = ("pending", "paused")
OWNER_INACTIVE = "owner_inactive"  # schedule/cancelled's reason, for clients to match
NO_PROGRESS = ("empty", "failed", "rejected")
# Misfire counting gives up past this many missed due times (a minutely cron
# down for a week is "more than 10000", not a loop).
MAX_COUNT = 10_000
_WORKER = f"{socket.gethostname()}:{os.getpid()}"


class Timed(Protocol):
    """What the timing functions read of a row: a Schedule's, a Monitor's."""

    due_at: datetime | None
    every_seconds: int | None
    cron: str
    misfire: str
    max_runs: int | None
    expires_at: datetime | None


# -- timing: one decision for schedules and monitors --------------------------


@dataclass(frozen=True)
class Due:
    """What a due time that has come means: `run` it (late by `late` seconds,
    folding `missed` later due times into this one), or skip it for `reason`
    (misfire policy `skip` after downtime)."""

    run: bool
    late: float
    missed: int
    reason: str = ""


def due_now(s: Timed, now: datetime) -> Due:
    """The misfire policy applied to a due time at or before `now`: a due time
    more than TERRET_SCHEDULE_GRACE_SECONDS late is a misfire; `skip` drops it
    (and the ones missed with it), `run_once` and `reschedule` run once."""
    assert s.due_at is not None
    late = (now - s.due_at).total_seconds()
    misfire = late > settings.TERRET_SCHEDULE_GRACE_SECONDS
    missed = missed_between(s, s.due_at, now) if misfire else 0
    if misfire and s.misfire == "skip":
        return Due(False, late, missed, f"misfire: {missed + 1} due time(s) passed while no worker ran")
    return Due(True, late, missed)


def next_due_after_run(s: Timed, now: datetime) -> datetime | None:
    """The next due time after a run at `now`: `reschedule` after a misfire
    restarts an interval from now; otherwise the recurrence keeps its phase."""
    if (
        s.misfire == "reschedule"
        and s.every_seconds
        and s.due_at is not None
        and s.due_at < now - timedelta(seconds=settings.TERRET_SCHEDULE_GRACE_SECONDS)
    ):
        return now + timedelta(seconds=s.every_seconds)
    return next_after(s, max(now, s.due_at) if s.due_at else now)


def next_due_after_skip(s: Timed, now: datetime) -> datetime | None:
    assert s.due_at is not None
    return next_after(s, max(now, s.due_at))


def bound_reached(s: Timed, runs: int, now: datetime) -> str | None:
    """A bound reached between two runs: the expiry, or a max_runs at or below
    the runs made (an operator, or an upgrade's migration, lowered it)."""
    if s.expires_at is not None and now >= s.expires_at:
        return f"expired at {s.expires_at.isoformat()}"
    if s.max_runs is not None and runs >= s.max_runs:
        return f"ran {runs} time(s) of {s.max_runs}"
    return None


def ends_after_run(s: Timed, runs: int, nxt: datetime | None) -> str | None:
    """Why the recurrence ends after its run number `runs`, whose next due
    time would be `nxt` (None: it goes on)."""
    if s.max_runs is not None and runs >= s.max_runs:
        return f"ran {runs} time(s) of {s.max_runs}"
    if nxt is None:
        return "a one-shot schedule that ran"
    if s.expires_at is not None and nxt >= s.expires_at:
        return f"expires at {s.expires_at.isoformat()}, before its next due time"
    return None


def next_after(s: Timed, after: datetime) -> datetime | None:
    """The schedule's first due time strictly after `after`, keeping the
    recurrence's phase (an interval counts from the current due time); None
    for a one-shot schedule."""
    if s.cron:
        return next(iter(CronSim(s.cron, after)))
    if s.every_seconds and s.due_at is not None:
        step = timedelta(seconds=s.every_seconds)
        if s.due_at > after:
            return s.due_at
        behind = (after - s.due_at) // step
        return s.due_at + step * (behind + 1)
    return None


def missed_between(s: Timed, since: datetime, until: datetime) -> int:
    """How many due times fall in (since, until]: those a misfire folds into one."""
    if s.every_seconds:
        return int((until - since).total_seconds() // s.every_seconds)
    if not s.cron:
        return 0
    count = 0
    for at in CronSim(s.cron, since):
        if at > until or count >= MAX_COUNT:
            break
        count += 1
    return count


def tick(*, now: datetime | None = None, rounds: int | None = None) -> int:
    """Fire what is due, round by round, until nothing is (or `rounds` ran).
    Returns how many schedules were handled (fired, skipped, finished, or
    marked failed)."""
    handled = 0
    done = 0
    while rounds is None or done < rounds:
        at = now or timezone.now()
        ids = _round(at)
        if not ids or lifecycle.draining.is_set():
            break  # nothing due that another worker is not firing now
        handled += _take(ids, at)
        done += 1
    return handled


def _round(at: datetime) -> list[uuid.UUID]:
    """One round's due schedules, fairly: at most TERRET_SCHEDULE_PER_SESSION
    of a session and TERRET_SCHEDULE_PER_OWNER of an owner, at most
    TERRET_SCHEDULE_ROUND in all, in turns: every owner's earliest due row
    first (the owner with the fewest due rows ahead), then every owner's
    second, and so on. One owner's storm so costs that owner the wait for
    later rounds; another owner's schedule leads the next round. Rows due
    beyond the readable range are taken too, so the clock marks them failed.
    The read skips rows another worker is firing (SKIP LOCKED; in autocommit,
    so its own locks end with the statement), and each row is then claimed
    by `_claim` with SKIP LOCKED: two workers take disjoint rows and never
    wait on each other, and a worker finds no round only when nothing is due
    that another is not already firing."""
    ops = connection.ops
    with connection.cursor() as cursor:
        skip = connection.features.has_select_for_update_skip_locked
        cursor.execute(
            _ROUND_SQL + (_SKIP_LOCKED if skip else ""),
            [
                ops.adapt_datetimefield_value(at),
                ops.adapt_datetimefield_value(DUE_READ_MAX),
                settings.TERRET_SCHEDULE_PER_SESSION,
                settings.TERRET_SCHEDULE_PER_OWNER,
                settings.TERRET_SCHEDULE_ROUND,
            ],
        )
        return [v if isinstance(v, uuid.UUID) else uuid.UUID(str(v)) for (v,) in cursor.fetchall()]


def _take(ids: list[uuid.UUID], at: datetime) -> int:
    """Claim and handle a round's rows in order, for at most half a poll period:
    a round that runs longer (a storm, a slow database) is read afresh, so a
    schedule of another owner that fell due meanwhile goes ahead of the rest
    of the storm instead of waiting for all of it."""
    ends = time.monotonic() + settings.TERRET_SCHEDULE_POLL_SECONDS / 2
    took = 0
    for sid in ids:
        took += _claim(sid, at)
        if time.monotonic() >= ends:
            break
    return took


# The window functions rank each session's and then each owner's due rows;
# the innermost scan is the partial index schedule_due (pending, by due_at).
_ROUND_SQL = f"""
SELECT s.id FROM {Schedule._meta.db_table} s JOIN (
    SELECT id, owner_rank, owner_due, due_at FROM (
        SELECT id, due_at, ROW_NUMBER() OVER (PARTITION BY owner_id ORDER BY due_at, id) AS owner_rank,
               COUNT(*) OVER (PARTITION BY owner_id) AS owner_due
        FROM (
            SELECT s.id, s.due_at, ss.owner_id,
                   ROW_NUMBER() OVER (PARTITION BY s.session_id ORDER BY s.due_at, s.id) AS session_rank
            FROM {Schedule._meta.db_table} s JOIN {Session._meta.db_table} ss ON ss.id = s.session_id
            WHERE s.status = 'pending' AND (s.due_at <= %s OR s.due_at >= %s)
        ) due WHERE session_rank <= %s
    ) fair WHERE owner_rank <= %s
    ORDER BY owner_rank, owner_due, due_at, id
    LIMIT %s
) round ON round.id = s.id
WHERE s.status = 'pending'
ORDER BY round.owner_rank, round.owner_due, round.due_at, round.id
"""
# The lock clause sits on the outer query: PostgreSQL allows none beside window functions.
_SKIP_LOCKED = " FOR UPDATE OF s SKIP LOCKED"


def _claim(sid: uuid.UUID, at: datetime) -> bool:
    """Claim one schedule of the round and handle it, in one transaction.
    False: another worker has it, or it is no longer due. A row that fails
    for any reason but a database outage is marked failed, once, with the
    reason, and the clock goes on with the others; an outage leaves it
    pending for a later tick."""
    generation: int | None = None
    try:
        with transaction.atomic():
            s = (
                Schedule.objects.select_for_update(skip_locked=True)
                .filter(Q(due_at__lte=at) | Q(due_at__gte=DUE_READ_MAX), id=sid, status="pending")
                .first()
            )
            if s is None:
                return False
            generation = s.generation
            _handle(s, at)
    except Exception as exc:
        if is_database_outage(exc):
            raise
        logger.exception("schedule %s could not be fired: marked failed", sid)
        _fail(sid, generation, f"the clock could not fire it: {type(exc).__name__}: {exc}", at)
    return True


def _fail(sid: uuid.UUID, generation: int | None, reason: str, now: datetime) -> None:
    """Mark a schedule failed without reading it (its row may be what failed).
    The generation it was claimed at, when known, keeps a firing by another
    worker since then from being overwritten."""
    rows = Schedule.objects.filter(id=sid, status="pending")
    if generation is not None:
        rows = rows.filter(generation=generation)
    reason = reason[:300]
    outcome = {"outcome": "skipped", "at": now.isoformat(), "due_at": None, "late_seconds": 0.0, "reason": reason}
    rows.update(
        status="failed",
        status_reason=reason,
        due_at=None,
        last_outcome=outcome,
        generation=F("generation") + 1,
        updated_at=now,
    )


def _handle(s: Schedule, now: datetime) -> None:
    s.generation += 1
    if due_unreadable(s.due_at):
        # Read back clamped (models.ClampedDateTimeField): the row holds a time
        # no datetime can; fired it would fail on every tick, so it ends here.
        _finish(s, "failed", "its due time lies outside the years 1..9999 in UTC", now)
        return
    session = Session.objects.select_related("profile", "owner").filter(id=s.session_id).first()
    stop = _stopped(s, session)
    if stop is not None:
        _finish(s, "cancelled", stop, now, log_it=True)
        return
    assert session is not None
    _count_last_run(s)
    ended = bound_reached(s, s.runs, now)
    if ended is not None:
        _finish(s, "completed", ended, now)
        return
    profile = session.profile
    pause_after = profile.schedule_pause_after if profile is not None else 3
    if pause_after and s.no_progress >= pause_after:
        _pause(s, now, pause_after)
        return
    if s.budget_tokens is not None and s.spent_tokens >= s.budget_tokens:
        _finish(s, "failed", f"its budget of {s.budget_tokens} tokens is spent ({s.spent_tokens})", now)
        return
    due = due_now(s, now)
    if not due.run:
        _skip(s, now, due.reason, due.late)
        return
    reason = _refusal(s, session)
    if reason is not None:
        _skip(s, now, reason, due.late)
        return
    _fire(s, session, now, due.late, due.missed)


def _stopped(s: Schedule, session: Session | None) -> str | None:
    if session is None:
        return "the session is gone"
    if session.revoked_seq is not None:
        return "the session was revoked"
    if getattr(session, "archived_at", None) is not None:
        return "the session was archived"
    if not session.owner.is_active:
        # Authority lapses with its owner's account (seed 003): checked at
        # every due time, so a deactivation stops the schedule at its next.
        return OWNER_INACTIVE
    return None


def _refusal(s: Schedule, session: Session) -> str | None:
    """Why this firing may not start a turn now (None: it may)."""
    profile = session.profile
    if profile is None:
        return "the session has no agent profile"
    if profile.max_schedules == 0:
        return "the profile allows no schedules"
    if s.every_seconds and s.every_seconds < profile.min_schedule_seconds:
        return f"the profile's shortest interval is now {profile.min_schedule_seconds} s"
    if s.last_input_seq is not None and not s.last_run_counted:
        placed, _ = input_fate(s.session_id, s.last_input_seq)
        if placed is None:
            return f"coalesced: its previous input (seq {s.last_input_seq}) still waits"
    hold = limits.hold_of(profile, suspended=session.suspended_seq is not None)
    if hold is not None:
        return f"held: {hold.message}"
    budgeted = any(getattr(session, f"budget_{name}") is not None for name in limits.BUDGETS)
    over = limits.check(session.id, profile, opening=True, budgeted=budgeted, parent=session.parent_session_id)
    if over is not None:
        return f"budget: {over.message}"
    return None


def _count_last_run(s: Schedule) -> None:
    """Fold the previous run's outcome into the no-progress count and the
    tokens spent, once its turn has ended."""
    if s.last_input_seq is None or s.last_run_counted:
        return
    placed, end = input_fate(s.session_id, s.last_input_seq)
    if placed is not None and placed.kind == "input/withdrawn":
        s.last_run_counted = True  # withdrawn by its owner: no run to judge
        return
    if placed is None or end is None:
        return  # still waiting, or its turn is still running
    s.last_run_counted = True
    s.no_progress = s.no_progress + 1 if end.data.get("status") in NO_PROGRESS else 0
    s.spent_tokens += _turn_tokens(s.session_id, placed.seq, end.seq)


def _turn_tokens(session_id: uuid.UUID, placed_seq: int, end_seq: int) -> int:
    start = turn_start_before(session_id, placed_seq) or placed_seq
    total = 0
    for e in turn_events(session_id, start):
        if e.seq > end_seq:
            break
        usage = e.data.get("usage") if e.kind == "step/end" else None
        if usage:
            total += int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    return total


def _fire(s: Schedule, session: Session, now: datetime, late: float, missed: int) -> None:
    assert s.due_at is not None
    run = s.runs + 1
    with log.locked(session.id) as tx:
        extra: dict[str, Any] = {"schedule_id": str(s.id)}
        event = admission.defer(tx, s.text, "follow_up", f"schedule:{s.id}", **extra)
        fired: dict[str, Any] = {
            "schedule_id": str(s.id),
            "due_at": s.due_at.isoformat(),
            "late_ms": max(0, int(late * 1000)),
            "run": run,
            "input_seq": event.seq,
            "worker": _WORKER,
        }
        if missed:
            fired["missed"] = missed
        tx.append("schedule/fired", fired)
        dispatch.wake(tx.session_id)
    s.runs = run
    s.last_input_seq = event.seq
    s.last_run_counted = False
    outcome = "late" if late > settings.TERRET_SCHEDULE_GRACE_SECONDS else "ran"
    s.last_outcome = _outcome(outcome, now, s.due_at, late, missed=missed)
    nxt = None if s.max_runs is not None and run >= s.max_runs else next_due_after_run(s, now)
    ends = ends_after_run(s, run, nxt)
    if ends is not None:
        _finish(s, "completed", ends, now, keep_outcome=True)
        return
    s.due_at = nxt
    _save(s, now)


def _skip(s: Schedule, now: datetime, reason: str, late: float) -> None:
    assert s.due_at is not None
    s.skipped += 1
    s.last_outcome = _outcome("skipped", now, s.due_at, late, reason=reason)
    nxt = next_due_after_skip(s, now)
    if nxt is None:
        _finish(s, "skipped", reason, now, keep_outcome=True)
        return
    s.due_at = nxt
    _save(s, now)


def _pause(s: Schedule, now: datetime, after: int) -> None:
    reason = f"paused after {s.no_progress} consecutive runs without progress (limit {after})"
    with log.locked(s.session_id) as tx:
        tx.append("schedule/paused", {"schedule_id": str(s.id), "reason": reason, "runs": s.runs})
    s.status = "paused"
    s.status_reason = reason
    _save(s, now)


def _finish(
    s: Schedule, status: str, reason: str, now: datetime, *, log_it: bool = False, keep_outcome: bool = False
) -> None:
    if log_it:
        with log.locked(s.session_id) as tx:
            tx.append("schedule/cancelled", {"schedule_id": str(s.id), "reason": reason, "by": "terret"})
    if not keep_outcome:
        s.last_outcome = _outcome("skipped", now, s.due_at, 0.0, reason=reason)
    s.status = status
    s.status_reason = reason
    s.due_at = None
    _save(s, now)


def _outcome(
    outcome: str, now: datetime, due: datetime | None, late: float, *, reason: str = "", missed: int = 0
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "outcome": outcome,
        "at": now.isoformat(),
        "due_at": due.isoformat() if due else None,
        "late_seconds": round(max(0.0, late), 3),
    }
    if reason:
        out["reason"] = reason
    if missed:
        out["missed"] = missed
    return out


def _save(s: Schedule, now: datetime) -> None:
    s.updated_at = now
    s.save()


# -- the clock thread -----------------------------------------------------------

_clock: threading.Thread | None = None
_clock_lock = threading.Lock()
_stopping = threading.Event()


def start_clock(active: Callable[[], bool] = lambda: True) -> None:
    """Start this process's clock thread (once). `active` is asked before
    every tick: a draining worker (SIGTERM) fires nothing more."""
    global _clock
    with _clock_lock:
        if _clock is not None and _clock.is_alive():
            return
        _stopping.clear()
        _clock = threading.Thread(target=_run_clock, args=(active,), name="terret-clock", daemon=True)
        _clock.start()


def stop_clock() -> None:
    """Stop the clock thread and wait for it (tests; a process exits without it)."""
    global _clock
    with _clock_lock:
        thread, _clock = _clock, None
    _stopping.set()
    if thread is not None:
        thread.join(timeout=10)


def _run_clock(active: Callable[[], bool]) -> None:
    while not _stopping.is_set():
        if active() and not lifecycle.draining.is_set():
            try:
                tick()
            except Exception:
                logger.exception("schedule clock tick failed")
            try:
                hooks.run_clocks()  # the apps' clocks: approval deadlines (approvals_app/deadlines.py)
            finally:
                connection.close()  # each tick on a fresh connection: none is held between ticks
        _stopping.wait(settings.TERRET_SCHEDULE_POLL_SECONDS)
