"""The approval clock: reminders, escalation and expiry of the requests that
run on a deadline (opt-in: a profile's approval_deadline_s / remind_every_s,
or a tool's own settings; approval/requested carries the clock it runs on).

Every worker's clock thread (runtime/schedules.py) calls `clock` through
runtime.hooks after its schedules, and that runs a `tick` about once a
second. A tick reads the open turns' requests that carry a clock, decides
what is due (`due`, pure), and appends it under the session's row lock,
deciding again there, so two workers' clocks append each event once. What
it appends are events of their own, never a human's verdict:
- approval/reminded every remind_every_s while the request waits (one per
  interval; after downtime one reminder, not a burst);
- approval/expired at the deadline: on_expiry `deny` settles the request (the
  model is told it expired, the turn goes on: a worker is woken; a verdict
  after that is refused, approval_expired); `park` leaves it waiting, and
- approval/escalated (to the group escalate_to) with a `park` expiry.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef
from django.utils import timezone

from approvals_app.selectors import ApprovalRecord, approval_records, open_turn_approvals
from sessions_app import log
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime import dispatch

# A tick reads at most this many sessions (a bound; the per-process next-due
# memory, `_next`, keeps the work to the sessions that have something due).
TICK_SESSION_CAP = 10_000
# The clock thread polls faster (TERRET_SCHEDULE_POLL_SECONDS) than deadlines
# in whole seconds need: each process reads the requests about once a second.
EVERY_SECONDS = 1.0
_last = -EVERY_SECONDS
# Most ticks look only at the sessions of profiles that set a clock now; every
# FULL_EVERY_SECONDS one looks at every waiting session, since a request keeps
# the clock it was asked with when its profile's settings change later.
FULL_EVERY_SECONDS = 60.0
_last_full = -FULL_EVERY_SECONDS
# Per process: session id -> (its head when read, when its clock next has
# something due). An optimization only: a session whose head moved (a new
# request, a verdict, another worker's clock event) is read again.
_next: dict[uuid.UUID, tuple[int, datetime]] = {}
FAR = datetime.max.replace(tzinfo=UTC)

Move = tuple[str, dict[str, Any]]


def due(record: ApprovalRecord, requested_at: datetime, now: datetime) -> list[Move]:
    """What the clock appends now for one request (in order): nothing for a
    request without a clock or already settled."""
    clock = record.deadline
    if clock is None or not record.open:
        return []
    waited = max(0.0, (now - requested_at).total_seconds())
    base = {"call_id": record.call_id, "request_seq": record.seq}
    moves: list[Move] = []
    deadline = clock.get("deadline_s")
    if deadline is not None and waited >= deadline and not record.expired:
        moves.append(("approval/expired", {**base, "deadline_s": deadline, "on_expiry": clock["on_expiry"]}))
        if clock["on_expiry"] == "deny":
            return moves  # settled: nothing more to remind anyone of
        if not record.escalated:
            moves.append(("approval/escalated", {**base, "to": clock.get("escalate_to"), "waited_s": round(waited, 1)}))
    every = clock.get("remind_every_s")
    if every:
        intervals = int(waited // every)
        if intervals > record.reminded:
            moves.append(("approval/reminded", {**base, "n": intervals, "waited_s": round(waited, 1)}))
    return moves


def next_due(record: ApprovalRecord, requested_at: datetime) -> datetime | None:
    """When the clock next has something to append for this request, as it
    stands (None: never, unless something happens to it)."""
    clock = record.deadline
    if clock is None or not record.open:
        return None
    times = []
    if clock.get("deadline_s") is not None and not record.expired:
        times.append(requested_at + timedelta(seconds=clock["deadline_s"]))
    if clock.get("remind_every_s"):
        times.append(requested_at + timedelta(seconds=clock["remind_every_s"] * (record.reminded + 1)))
    return min(times, default=None)


def clock() -> int:
    """The clock thread's hook: `tick`, at most once every EVERY_SECONDS."""
    global _last, _last_full
    started = time.monotonic()
    if started - _last < EVERY_SECONDS:
        return 0
    _last = started
    full = started - _last_full >= FULL_EVERY_SECONDS
    if full:
        _last_full = started
    return tick(full=full)


def clocked_profiles() -> list[int]:
    """The profiles that set a clock now: a deadline or reminders of their
    own, or a tool's (a small table, read whole)."""
    rows = AgentProfile.objects.values_list("id", "approval_deadline_s", "remind_every_s", "approvals")
    return [pk for pk, deadline, remind, tools in rows if deadline or remind or _tool_clock(tools)]


def _tool_clock(approvals: Any) -> bool:
    return isinstance(approvals, dict) and any(
        isinstance(own, dict) and (own.get("approval_deadline_s") or own.get("remind_every_s"))
        for own in approvals.values()
    )


def tick(now: datetime | None = None, *, full: bool = True) -> int:
    """Append what is due across the sessions waiting on a clocked request
    (not `full`: only those of profiles that set a clock now); returns how
    many events were appended."""
    at = now or timezone.now()
    # From the sessions waiting on a reviewer (a partial index), those whose
    # open turn holds a request on a clock (one indexed probe each).
    clocked_request = Event.objects.filter(
        session_id=OuterRef("pk"),
        kind="approval/requested",
        seq__gte=OuterRef("open_turn_seq"),
        data__has_key="deadline",
    )
    waiting = Session.objects.filter(pending_approvals__gt=0, open_turn_seq__isnull=False)
    if not full:
        profiles = clocked_profiles()
        if not profiles:
            return 0
        waiting = waiting.filter(profile_id__in=profiles)
    clocked = list(waiting.filter(Exists(clocked_request)).values_list("id", "last_seq")[:TICK_SESSION_CAP])
    for sid in set(_next) - {sid for sid, _ in clocked}:
        del _next[sid]
    appended = 0
    for sid, head in clocked:
        known = _next.get(sid)
        if known is not None and known[0] == head and known[1] > at:
            continue  # nothing due yet, and nothing happened since it was read
        moves, upcoming = _plan(sid, at)
        if moves:
            _next.pop(sid, None)
            appended += _apply(sid, at)
        else:
            _next[sid] = (head, upcoming or FAR)
    return appended


def _plan(sid: uuid.UUID, at: datetime, turn_seq: int | None = None) -> tuple[list[Move], datetime | None]:
    """What is due in the session's open turn, and when the next thing after
    that is (read without the lock unless `turn_seq` comes from a locked row)."""
    if turn_seq is None:
        turn_seq = Session.objects.filter(id=sid).values_list("open_turn_seq", flat=True).first()
        if turn_seq is None:
            return [], None
    records = [r for r in approval_records(open_turn_approvals(sid, turn_seq)) if r.open and r.deadline]
    if not records:
        return [], None
    stamps = dict(
        Event.objects.filter(session_id=sid, seq__in=[r.seq for r in records]).values_list("seq", "created_at")
    )
    clocked = [(r, stamps[r.seq]) for r in records if r.seq in stamps]
    moves = [move for r, asked in clocked for move in due(r, asked, at)]
    upcoming = [when for r, asked in clocked if (when := next_due(r, asked)) is not None]
    return moves, min(upcoming, default=None)


def _apply(sid: uuid.UUID, at: datetime) -> int:
    """Decide again under the row lock, and append."""
    with log.locked(sid) as tx:
        turn_seq = tx.row["open_turn_seq"]
        moves = _plan(sid, at, turn_seq)[0] if turn_seq is not None else []
        for kind, data in moves:
            tx.append(kind, data)
        if any(kind == "approval/expired" and data["on_expiry"] == "deny" for kind, data in moves):
            dispatch.wake(sid)  # after commit: a worker carries on the turn with the denial
    return len(moves)
