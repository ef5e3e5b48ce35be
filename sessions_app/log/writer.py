"""The writer: the only code that inserts events (see the package docstring).

Every write goes through `_write`: validate and serialize the events, split
the batch into runs (runs.split), and write each run with the backend's
UPDATE-then-INSERT, either as one autocommit statement (PostgreSQL, outside
a transaction, a single run) or inside a transaction. Seq assignment happens
in the UPDATE of the session row, which holds the row lock until commit; on
SQLite the IMMEDIATE transaction serializes writers instead. Two appenders in
two OS processes therefore never claim the same seq, and seqs run gapless
from 1 (a rolled-back transaction rolls back its seq too).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from sessions_app.errors import InvalidPayload, LeaseLost, SessionNotFound, TurnAlreadyOpen, UnknownEventKind
from sessions_app.log import backends, fanout, hints, runs, tiering
from sessions_app.log.records import WORKLOAD_COLUMNS, AppendedEvent, Fence, Workload
from sessions_app.log.runs import Guard, Run
from sessions_app.models import Session

Items = list[tuple[str, dict[str, Any]]]


class Appended(list[AppendedEvent]):
    """The events an append wrote, in seq order (empty: a guard failed and
    nothing was written). A releasing append also carries the session's
    workload as it left it."""

    workload: Workload | None = None


def append(
    session_id: uuid.UUID | str, kind: str, data: dict[str, Any], *, fence: Fence | None = None
) -> AppendedEvent:
    (event,) = _write(_sid(session_id), [(kind, data)], fence=fence, guard=None, release=False)
    return event


def append_many(
    session_id: uuid.UUID | str,
    items: Items,
    *,
    fence: Fence | None = None,
    guard: Guard | None = None,
    release: bool = False,
) -> Appended:
    if release and fence is None:
        raise ValueError("a releasing append needs the lease's fence")
    if not items:
        return Appended()
    return _write(_sid(session_id), items, fence=fence, guard=guard, release=release)


def refusal(kind: str, data: dict[str, Any]) -> str | None:
    """Why the log would refuse this event (its validation, nothing written); None if it would take it."""
    try:
        runs.prepare(kind, data)
    except (UnknownEventKind, InvalidPayload) as exc:
        return str(exc)
    return None


def _sid(session_id: uuid.UUID | str) -> uuid.UUID:
    return session_id if isinstance(session_id, uuid.UUID) else uuid.UUID(str(session_id))


def _write(sid: uuid.UUID, items: Items, *, fence: Fence | None, guard: Guard | None, release: bool) -> Appended:
    prepared = [runs.prepare(kind, data) for kind, data in items]  # refuse before writing anything
    if guard is not None:
        runs.guard_sql(guard)
    batch = runs.split(sid, prepared, timezone.now(), fence, guard, release)
    backend = backends.current()
    if backend.ONE_STATEMENT and len(batch) == 1 and not connection.in_atomic_block:
        return _write_autocommit(backend, batch[0])
    return _write_atomic(backend, batch)


def _write_autocommit(backend: Any, run: Run) -> Appended:
    """One statement, its own transaction: committed when it returns. No seq
    can be reserved before commit here, so the fan-out holds the session's
    deliveries while the statement is in flight (fanout._Dispatcher)."""
    sid = run.session_id
    events = Appended()
    fanout.dispatcher.begin(sid)
    try:
        rows = backend.append_run(run)
        if not rows:
            _nothing_written(run)
            return events
        events.extend(_events(run, rows))
        if run.release:
            events.workload = Workload.from_row(rows[0])
    finally:
        fanout.dispatcher.end_many(sid, list(events))
    hints.publish_event(sid, events[-1].seq)
    return events


def _write_atomic(backend: Any, batch: list[Run]) -> Appended:
    sid = batch[0].session_id
    # Reservations are exact only when this block owns the transaction; inside
    # a caller's transaction an outer rollback could not release them.
    track = not connection.in_atomic_block
    events = Appended()
    # The try wraps the atomic block: a COMMIT that fails (dropped connection)
    # rolls the seqs back too, and a reservation left behind would hold back
    # every later event of the session in this process.
    try:
        with transaction.atomic():
            for run in batch:
                rows = backend.append_run(run)
                if not rows:
                    _nothing_written(run)  # only the first run can get here: it holds the row lock after
                    return events
                new = _events(run, rows)
                if track:
                    for event in new:
                        fanout.dispatcher.reserve(sid, event.seq)
                events.extend(new)
                if run.release:
                    events.workload = Workload.from_row(rows[0])
            committed = list(events)
            transaction.on_commit(lambda: fanout.after_commit(committed), robust=True)
    except BaseException:
        if track:
            fanout.dispatcher.release(sid, [e.seq for e in events])
        raise
    return events


def _events(run: Run, rows: list[dict[str, Any]]) -> list[AppendedEvent]:
    return [
        AppendedEvent(run.session_id, int(row["seq"]), item.kind, item.data, run.now)
        for row, item in zip(rows, run.items, strict=True)
    ]


def _nothing_written(run: Run) -> None:
    """The session row did not match: returns if it was the guard, raises
    SessionNotFound, LeaseLost or TurnAlreadyOpen otherwise. (Only on this
    path is the row read again: a write that lands costs no read.)"""
    row = Session.objects.filter(id=run.session_id).values_list("lease_gen", "open_turn_seq").first()
    if row is None:
        raise SessionNotFound(f"no session {run.session_id}")
    current, open_turn = row
    if run.fence is not None and current != run.fence.gen:
        raise LeaseLost(f"session {run.session_id}: lease generation {run.fence.gen} superseded by {current}")
    if run.guard is not None:
        return
    if run.opens_turn:  # the fence held, so the open turn was why (it may have closed since)
        raise TurnAlreadyOpen(f"session {run.session_id}: a turn was open ({open_turn}); turn/start refused")
    raise LeaseLost(f"session {run.session_id}: the row did not match lease generation {current}")


# ---------------------------------------------------------------- locked


LOCK_COLUMNS = (
    "id",
    "owner_id",
    "profile_id",
    "last_seq",
    "compacted_seq",
    "policy_seq",
    "title",
    "model_main",
    "model_titler",
    "model_compactor",
    "budget_cost_usd",
    "budget_tokens",
    "budget_steps",
    "budget_turns",
    "held_seq",
    "suspended_seq",
    "revoked_seq",
    "lease_owner",
    "lease_gen",
    "lease_expires_at",
    "agent_version",
    "storage_tier",
    "parent_session_id",
    *WORKLOAD_COLUMNS,
)


@dataclass
class SessionTx:
    """A transaction holding one session's row lock (see `locked`). `row` is
    the session row as locked (LOCK_COLUMNS); append through `append`."""

    session_id: uuid.UUID
    fence: Fence | None
    row: dict[str, Any]
    appended: list[AppendedEvent] = field(default_factory=list)
    track: bool = True

    def append(self, kind: str, data: dict[str, Any]) -> AppendedEvent:
        (run,) = runs.split(self.session_id, [runs.prepare(kind, data)], timezone.now(), self.fence, None, False)
        rows = backends.current().append_run(run)
        if not rows:
            _nothing_written(run)
        (event,) = _events(run, rows)
        if self.track:
            fanout.dispatcher.reserve(self.session_id, event.seq)
        self.appended.append(event)
        transaction.on_commit(lambda: fanout.after_commit([event]), robust=True)
        return event

    def fence_out(self) -> bool:
        """Supersede the lease, for a caller about to act on the open turn
        because no live lease covers it (a cancel or an operator closing it,
        an upgrade moving it). A lease that lapsed still has its generation,
        and its holder may still be running (a late keeper, a stalled
        process): a fenced append re-checks only the generation, so without
        this it would append to a turn closed under it. Bumping the
        generation makes the holder's next append, renewal and release fail
        (LeaseLost). False (nothing written): no holder, the lease was
        released."""
        if not self.row["lease_owner"]:
            return False
        Session.objects.filter(id=self.session_id).update(lease_gen=F("lease_gen") + 1, **runs.RELEASED)
        self.row.update(lease_gen=self.row["lease_gen"] + 1, **runs.RELEASED)
        return True


@contextmanager
def locked(session_id: uuid.UUID | str, *, fence: Fence | None = None, thaw: bool = True) -> Iterator[SessionTx]:
    """The session's row lock for a check-then-act: append through tx.append.
    A cold session is thawed first (log/tiering.py), inside the same
    transaction, so every locked write meets its whole log in the event
    table; `thaw=False` for the storage mover itself."""
    sid = _sid(session_id)
    track = not connection.in_atomic_block
    tx: SessionTx | None = None
    try:
        with transaction.atomic():
            row = Session.objects.select_for_update().filter(id=sid).values(*LOCK_COLUMNS).first()
            if row is None:
                raise SessionNotFound(f"no session {sid}")
            if fence is not None and row["lease_gen"] != fence.gen:
                raise LeaseLost(f"session {sid}: lease generation {fence.gen} superseded by {row['lease_gen']}")
            tx = SessionTx(sid, fence, row, track=track)
            if thaw and row["storage_tier"] == "cold":
                tiering.thaw_in(tx, by="")
            yield tx
    except BaseException:
        if track and tx is not None:
            fanout.dispatcher.release(sid, [e.seq for e in tx.appended])
        raise
