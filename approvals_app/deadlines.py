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
from datetime import datetime
from typing import Any

from django.db.models import F
from django.utils import timezone

from approvals_app.selectors import ApprovalRecord, approval_records, open_turn_approvals
from sessions_app import log
from sessions_app.models import Event, Session
from sessions_app.runtime import dispatch

# A tick reads at most this many sessions' clocked requests (the rest wait a tick).
TICK_SESSION_CAP = 200
# The clock thread polls faster (TERRET_SCHEDULE_POLL_SECONDS) than deadlines
# in whole seconds need: each process reads the requests about once a second.
EVERY_SECONDS = 1.0
_last = -EVERY_SECONDS

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


def clock() -> int:
    """The clock thread's hook: `tick`, at most once every EVERY_SECONDS."""
    global _last
    if time.monotonic() - _last < EVERY_SECONDS:
        return 0
    _last = time.monotonic()
    return tick()


def tick(now: datetime | None = None) -> int:
    """Append what is due across the sessions waiting on a clocked request;
    returns how many events were appended."""
    at = now or timezone.now()
    clocked = (
        Event.objects.filter(
            session__pending_approvals__gt=0,
            session__open_turn_seq__isnull=False,
            kind="approval/requested",
            seq__gte=F("session__open_turn_seq"),
            data__has_key="deadline",
        )
        .values_list("session_id", flat=True)
        .distinct()
    )
    appended = 0
    for sid in list(clocked[:TICK_SESSION_CAP]):
        if _moves(sid, at):
            appended += _apply(sid, at)
    return appended


def _moves(sid: uuid.UUID, at: datetime, turn_seq: int | None = None) -> list[Move]:
    """What is due in the session's open turn (read without the lock unless
    `turn_seq` comes from a locked row)."""
    if turn_seq is None:
        turn_seq = Session.objects.filter(id=sid).values_list("open_turn_seq", flat=True).first()
        if turn_seq is None:
            return []
    records = [r for r in approval_records(open_turn_approvals(sid, turn_seq)) if r.open and r.deadline]
    if not records:
        return []
    stamps = dict(
        Event.objects.filter(session_id=sid, seq__in=[r.seq for r in records]).values_list("seq", "created_at")
    )
    return [move for r in records if r.seq in stamps for move in due(r, stamps[r.seq], at)]


def _apply(sid: uuid.UUID, at: datetime) -> int:
    """Decide again under the row lock, and append."""
    with log.locked(sid) as tx:
        turn_seq = tx.row["open_turn_seq"]
        moves = _moves(sid, at, turn_seq) if turn_seq is not None else []
        for kind, data in moves:
            tx.append(kind, data)
        if any(kind == "approval/expired" and data["on_expiry"] == "deny" for kind, data in moves):
            dispatch.wake(sid)  # after commit: a worker carries on the turn with the denial
    return len(moves)
