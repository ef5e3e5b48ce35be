"""The only way into the session log.

`append()` and `locked()` are the single entry point. Within one
transaction per call they (1) take the session's row lock, (2) assign the next
seq, (3) insert the event, (4) update the session's projection columns and
(5) reserve the event's place in this process's fan-out. After commit the
event is delivered to in-process listeners in seq order and a hint goes to the
session's channel-layer group.

Seq assignment happens in the UPDATE of the session row, which holds the row
lock until commit; on SQLite the IMMEDIATE transaction mode serializes writers
instead. Two appenders in two OS processes therefore never claim the same seq,
and seqs run gapless from 1 (a rolled-back transaction rolls back its seq too).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NoReturn

from django.db import connection, transaction
from django.utils import timezone

from sessions_app import events as catalogue
from sessions_app.events import InvalidPayload, UnknownEventKind

log = logging.getLogger(__name__)

__all__ = [
    "AppendedEvent",
    "Fence",
    "InvalidPayload",
    "LeaseLost",
    "SessionNotFound",
    "UnknownEventKind",
    "append",
    "locked",
    "on_event",
]


class SessionNotFound(LookupError):
    pass


class LeaseLost(RuntimeError):
    """The caller's lease generation is no longer current: another worker owns the session."""


@dataclass(frozen=True)
class Fence:
    """Proof of lease ownership carried by turn code. Every fenced append
    re-checks `gen` under the row lock and extends the lease by `ttl`."""

    gen: int
    ttl: float


@dataclass(frozen=True)
class AppendedEvent:
    session_id: uuid.UUID
    seq: int
    kind: str
    data: dict[str, Any]
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "data": self.data, "at": self.created_at.isoformat()}


# --------------------------------------------------------------------------
# fan-out

Listener = Callable[[AppendedEvent], None]
_listeners: list[tuple[frozenset[str] | None, Listener]] = []


def on_event(*kinds: str) -> Callable[[Listener], Listener]:
    """Register a session-event listener for the given kinds (none: every kind).

    Listeners run after commit, in seq order per session, one at a time per
    process. A listener's own append is queued behind the event it is
    handling. A failing listener is logged and does not affect the others.
    """

    def register(fn: Listener) -> Listener:
        _listeners.append((frozenset(kinds) if kinds else None, fn))
        return fn

    return register


class _Dispatcher:
    """Delivers committed events to listeners in seq order per session.

    A seq is reserved under the row lock, before commit; delivery of a later
    seq waits until every earlier reservation made in this process has either
    committed or rolled back. That keeps order even when two threads' commit
    callbacks run in the opposite order to their commits.

    An autocommit append (the Postgres fast path) cannot reserve: its seq is
    known only when its statement returns, already committed. While one is in
    flight (begin() .. end()) nothing of its session is delivered, because an
    event committed after it, with a higher seq, may already be waiting.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reserved: dict[uuid.UUID, set[int]] = defaultdict(set)
        self._ready: dict[uuid.UUID, dict[int, AppendedEvent]] = defaultdict(dict)
        self._inflight: dict[uuid.UUID, int] = defaultdict(int)
        self._draining = False

    def reserve(self, session_id: uuid.UUID, seq: int) -> None:
        with self._lock:
            self._reserved[session_id].add(seq)

    def release(self, session_id: uuid.UUID, seqs: list[int]) -> None:
        with self._lock:
            reserved = self._reserved.get(session_id)
            if reserved is not None:
                reserved.difference_update(seqs)
                if not reserved:  # no empty entry per rolled-back session, forever
                    del self._reserved[session_id]
        self._drain()

    def committed(self, event: AppendedEvent) -> None:
        with self._lock:
            self._ready[event.session_id][event.seq] = event
        self._drain()

    def begin(self, session_id: uuid.UUID) -> None:
        with self._lock:
            self._inflight[session_id] += 1

    def end_many(self, session_id: uuid.UUID, events: list[AppendedEvent]) -> None:
        with self._lock:
            for event in events[:-1]:
                self._ready[session_id][event.seq] = event
        self.end(session_id, events[-1] if events else None)

    def end(self, session_id: uuid.UUID, event: AppendedEvent | None) -> None:
        """The in-flight autocommit append finished: committed as `event`, or
        failed (None)."""
        with self._lock:
            if event is not None:
                self._ready[session_id][event.seq] = event
            left = self._inflight[session_id] - 1
            if left > 0:
                self._inflight[session_id] = left
            else:
                del self._inflight[session_id]
        self._drain()

    def _next_batch(self) -> list[AppendedEvent]:
        out: list[AppendedEvent] = []
        for sid in list(self._ready):
            if self._inflight.get(sid):
                continue
            ready = self._ready[sid]
            reserved = self._reserved.get(sid, set())
            for seq in sorted(ready):
                if any(r < seq for r in reserved):
                    break
                out.append(ready.pop(seq))
                reserved.discard(seq)
            if not ready:
                del self._ready[sid]
            if sid in self._reserved and not self._reserved[sid]:
                del self._reserved[sid]
        return out

    def _drain(self) -> None:
        # One drainer at a time; an append made by a listener lands in _ready
        # and is picked up by the loop below after the current event is done.
        with self._lock:
            if self._draining:
                return
            self._draining = True
        try:
            while True:
                with self._lock:
                    batch = self._next_batch()
                    if not batch:
                        self._draining = False
                        return
                for event in batch:
                    _deliver(event)
        except BaseException:
            with self._lock:
                self._draining = False
            raise


def _deliver(event: AppendedEvent) -> None:
    for kinds, fn in list(_listeners):
        if kinds is not None and event.kind not in kinds:
            continue
        try:
            fn(event)
        except Exception:
            log.exception("session listener %s failed on %s#%s %s", fn, event.session_id, event.seq, event.kind)


dispatcher = _Dispatcher()


def _after_commit(event: AppendedEvent) -> None:
    from sessions_app import hints

    dispatcher.committed(event)
    hints.publish_event(event.session_id, event.seq)


# --------------------------------------------------------------------------
# appends

_SESSION = "sessions_app_session"
_EVENT = "sessions_app_event"


def _prepare(kind: str, data: dict[str, Any]) -> tuple[catalogue.Kind, str]:
    spec = catalogue.validate(kind, data)
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    if "\\u0000" in payload and has_nul(data):
        # jsonb (and so the log on Postgres) cannot hold NUL; refuse on every
        # backend so both behave the same.
        raise InvalidPayload(f"{kind}: strings must not contain NUL characters")
    return spec, payload


def has_nul(value: Any) -> bool:
    """Whether a JSON-like value holds a NUL character anywhere (Postgres
    text and jsonb cannot store one)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v) for v in value)
    return False


def _set_clause(
    spec: catalogue.Kind, data: dict[str, Any], now: datetime, fence: Fence | None
) -> tuple[str, list[Any]]:
    parts = ["last_seq = last_seq + 1", "last_event_at = %s"]
    params: list[Any] = [now]
    if spec.project is not None:
        for sql, p in spec.project(data):
            parts.append(sql.replace("NEW_SEQ", "last_seq + 1"))
            params.extend(p)
    if fence is not None:
        parts.append("lease_expires_at = %s")
        params.append(now + timedelta(seconds=fence.ttl))
    return ", ".join(parts), params


# Conditions on the session row that a guarded append (append_if) may demand.
# A guard is a key, or (key, value) for one that compares with a value.
GUARDS: dict[str, str] = {
    "untitled": "title = ''",
    # No open turn and nothing queued: a wake may open a turn with its own text only.
    "idle_empty_inbox": "open_turn_seq IS NULL AND last_input_seq <= inbox_seq",
    # The policy head is still the given policy/updated seq (0: none yet).
    "policy_at": "COALESCE(policy_seq, 0) = %s",
}
Guard = str | tuple[str, Any]


def _guard_sql(guard: Guard) -> tuple[str, list[Any]]:
    """The guard's condition and its parameters; ValueError for an unknown
    key or a wrong number of values."""
    name, *values = (guard,) if isinstance(guard, str) else guard
    sql = GUARDS.get(name)
    if sql is None:
        raise ValueError(f"unknown append guard {name!r}")
    if sql.count("%s") != len(values):
        raise ValueError(f"append guard {name!r} takes {sql.count('%s')} value(s)")
    return sql, values


def _insert(session_id: uuid.UUID, kind: str, data: dict[str, Any], fence: Fence | None) -> AppendedEvent:
    """Seq assignment + insert + projection update. Caller holds a transaction."""
    event = _insert_if(session_id, kind, data, fence, None)
    assert event is not None  # without a guard a missed row raises
    return event


def _insert_if(
    session_id: uuid.UUID,
    kind: str,
    data: dict[str, Any],
    fence: Fence | None,
    guard: Guard | None,
    now: datetime | None = None,
) -> AppendedEvent | None:
    """_insert, or None (nothing written) when the row fails `guard`. The
    events of one batch share `now`, as they share their commit."""
    spec, payload = _prepare(kind, data)
    now = now or timezone.now()
    set_sql, set_params = _set_clause(spec, data, now, fence)
    extras = spec.extra(data) if spec.extra is not None else []  # noqa: S610 - the catalogue's SQL, not QuerySet.extra
    pg = connection.vendor == "postgresql"
    if not pg:
        # SQLite stores UUIDs as hex text and needs datetimes adapted by Django.
        set_params = [_sqlite_param(p) for p in set_params]
    sid: Any = session_id if pg else session_id.hex
    where = "id = %s"
    where_params: list[Any] = [sid]
    if fence is not None:
        where += " AND lease_gen = %s"
        where_params.append(fence.gen)
    if guard is not None:
        guard_sql, guard_params = _guard_sql(guard)
        where += f" AND {guard_sql}"
        where_params.extend(guard_params)
    if pg:
        # One round trip: the UPDATE takes the row lock and yields the seq;
        # a kind's extra writes ride along as data-modifying CTEs.
        returning, ctes, extra_params = _extra_ctes(extras, now)
        row = _pg_execute(
            f"WITH s AS (UPDATE {_SESSION} SET {set_sql} WHERE {where} RETURNING last_seq{returning}){ctes} "
            f"INSERT INTO {_EVENT} (session_id, seq, kind, data, created_at) "
            f"SELECT %s, s.last_seq, %s, %s::jsonb, %s FROM s RETURNING seq",
            [*set_params, *where_params, *extra_params, session_id, kind, payload, now],
        )
    with connection.cursor() as cur:
        if not pg:
            cur.execute(
                f"UPDATE {_SESSION} SET {set_sql} WHERE {where} RETURNING last_seq, profile_id",
                [*set_params, *where_params],
            )
            row = cur.fetchone()
            if row is not None:
                cur.execute(
                    f"INSERT INTO {_EVENT} (session_id, seq, kind, data, created_at) VALUES (%s, %s, %s, %s, %s)",
                    [sid, row[0], kind, payload, _sqlite_param(now)],
                )
                for sql, params in extras:  # only kinds with extras (step/end, usage/recorded)
                    cur.execute(
                        f"WITH s(last_seq, profile_id, day) AS (SELECT %s, %s, %s) {sql}",
                        [row[0], row[1], now.date().isoformat(), *params],
                    )
    if row is None:
        if guard is not None and _guard_failed(session_id, fence):
            return None
        _raise_missing(session_id, fence)
    return AppendedEvent(session_id, int(row[0]), kind, data, now)


def _guard_failed(session_id: uuid.UUID, fence: Fence | None) -> bool:
    """A guarded UPDATE matched nothing: was it the guard (not a missing
    session or a lost lease)?"""
    from sessions_app.models import Session

    current = Session.objects.filter(id=session_id).values_list("lease_gen", flat=True).first()
    return current is not None and (fence is None or current == fence.gen)


def _pg_execute(sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    """Run one statement on Django's own psycopg connection (so it joins the
    current transaction, or autocommits outside one) with server-side binding.
    Django's cursors bind client-side, which costs a Python-side mogrify per
    call and can never use a prepared statement; a plain psycopg cursor runs
    the runtime's few fixed statements prepared (see pg_rows)."""
    rows = pg_rows(sql, params)
    return rows[0] if rows else None


def pg_rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Postgres only: one of the runtime's hot, fixed-shape statements (an
    append, the lease claim and release, the turn load), prepared on its
    first use on each connection. Planning an UPDATE-then-INSERT CTE costs
    more than running it, and a worker's pool spreads the statements over
    many connections, so waiting for psycopg's usual 5 uses per connection
    would leave most of them unprepared. With TERRET_DB_PREPARE_THRESHOLD=0
    (a transaction-mode pooler) nothing is prepared."""
    import psycopg

    connection.ensure_connection()
    started = time.monotonic()
    with psycopg.Cursor(connection.connection) as cur:  # type: ignore[arg-type]
        cur.execute(sql, params, prepare=True)  # type: ignore[arg-type]
        rows = cur.fetchall() if cur.description is not None else []
    if connection.queries_logged:
        # Counted like Django's own queries (DEBUG, CaptureQueriesContext).
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return rows


def _extra_ctes(extras: list[catalogue.Assignment], now: datetime) -> tuple[str, str, list[Any]]:
    """Postgres: a kind's extra writes as CTEs reading the updated session row
    `s` (s.profile_id, s.day = the event's UTC date). No extra round trip."""
    if not extras:
        return "", "", []
    ctes = "".join(f", x{i} AS ({sql})" for i, (sql, _) in enumerate(extras))
    params: list[Any] = [now.date()]
    for _, p in extras:
        params.extend(p)
    return ", profile_id, CAST(%s AS date) AS day", ctes, params


def _sqlite_param(value: Any) -> Any:
    if isinstance(value, datetime):
        return connection.ops.adapt_datetimefield_value(value)
    return value


def _raise_missing(session_id: uuid.UUID, fence: Fence | None) -> NoReturn:
    from sessions_app.models import Session

    current = Session.objects.filter(id=session_id).values_list("lease_gen", flat=True).first()
    if current is None:
        raise SessionNotFound(f"no session {session_id}")
    raise LeaseLost(f"session {session_id}: lease generation {fence.gen if fence else '?'} superseded by {current}")


@dataclass
class SessionTx:
    """A transaction holding one session's row lock. Append through it."""

    session_id: uuid.UUID
    fence: Fence | None
    row: dict[str, Any]
    appended: list[AppendedEvent] = field(default_factory=list)
    _track: bool = True

    def append(self, kind: str, data: dict[str, Any]) -> AppendedEvent:
        event = _insert(self.session_id, kind, data, self.fence)
        if self._track:
            dispatcher.reserve(self.session_id, event.seq)
        self.appended.append(event)
        transaction.on_commit(lambda e=event: _after_commit(e), robust=True)  # type: ignore[misc]
        return event


_LOCK_COLUMNS = (
    "id",
    "owner_id",
    "profile_id",
    "last_seq",
    "open_turn_seq",
    "pending_approvals",
    "compacted_seq",
    "policy_seq",
    "inbox_seq",
    "last_input_seq",
    "title",
    "model_main",
    "model_titler",
    "model_compactor",
    "lease_owner",
    "lease_gen",
    "lease_expires_at",
)


@contextmanager
def locked(session_id: uuid.UUID | str, *, fence: Fence | None = None) -> Iterator[SessionTx]:
    """Open a transaction holding the session's row lock.

    Use it when a decision and the appends it leads to must be atomic
    (check-then-act: admission, verdicts, compaction boundaries). Raises
    SessionNotFound, or LeaseLost when `fence` is no longer current.
    Nothing external (model calls, group sends, task dispatch) belongs inside.
    """
    from sessions_app.models import Session

    sid = uuid.UUID(str(session_id))
    # Reservations are exact only when this block owns the transaction; inside
    # a caller's transaction an outer rollback could not release them.
    track = not connection.in_atomic_block
    tx: SessionTx | None = None
    # The try wraps the atomic block, not just the yield: a COMMIT that fails
    # (dropped connection) rolls the seqs back too, and a reservation left
    # behind would hold back every later event of the session in this process.
    try:
        with transaction.atomic():
            row = Session.objects.select_for_update().filter(id=sid).values(*_LOCK_COLUMNS).first()
            if row is None:
                raise SessionNotFound(f"no session {sid}")
            if fence is not None and row["lease_gen"] != fence.gen:
                raise LeaseLost(f"session {sid}: lease generation {fence.gen} superseded by {row['lease_gen']}")
            tx = SessionTx(sid, fence, row, _track=track)
            yield tx
    except BaseException:
        if track and tx is not None:
            dispatcher.release(sid, [e.seq for e in tx.appended])
        raise


def append(
    session_id: uuid.UUID | str, kind: str, data: dict[str, Any], *, fence: Fence | None = None
) -> AppendedEvent:
    """Append one event. Raises UnknownEventKind/InvalidPayload (nothing is
    written), SessionNotFound, or LeaseLost for a superseded fence."""
    sid = uuid.UUID(str(session_id))
    catalogue.validate(kind, data)  # fail before opening a transaction
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        return _append_autocommit(sid, kind, data, fence)
    track = not connection.in_atomic_block
    event: AppendedEvent | None = None
    try:
        with transaction.atomic():
            event = _insert(sid, kind, data, fence)
            if track:
                dispatcher.reserve(sid, event.seq)
            transaction.on_commit(lambda: _after_commit(event), robust=True)  # type: ignore[arg-type]
    except BaseException:
        if track and event is not None:
            dispatcher.release(sid, [event.seq])
        raise
    return event


def append_if(
    session_id: uuid.UUID | str,
    kind: str,
    data: dict[str, Any],
    *,
    guard: Guard,
    fence: Fence | None = None,
) -> AppendedEvent | None:
    """Append one event only while the session row meets `guard` (see
    GUARDS), decided by the append's own row lock: a check-then-act in one
    statement. Returns None, having written nothing, when the guard fails."""
    events = append_many(session_id, [(kind, data)], fence=fence, guard=guard)
    return events[0] if events else None


def _append_autocommit(sid: uuid.UUID, kind: str, data: dict[str, Any], fence: Fence | None) -> AppendedEvent:
    """Postgres fast path: the UPDATE-then-INSERT statement is its own
    transaction (one round trip, committed when it returns). There is no
    pre-commit reservation here, so the dispatcher holds the session's
    deliveries while the statement is in flight (see _Dispatcher)."""
    dispatcher.begin(sid)
    event: AppendedEvent | None = None
    try:
        event = _insert(sid, kind, data, fence)
    finally:
        dispatcher.end(sid, event)
    assert event is not None
    from sessions_app import hints

    hints.publish_event(event.session_id, event.seq)
    return event


def append_many(
    session_id: uuid.UUID | str,
    items: list[tuple[str, dict[str, Any]]],
    *,
    fence: Fence | None = None,
    guard: Guard | None = None,
) -> list[AppendedEvent]:
    """Append several events atomically, in order, on consecutive seqs.

    On PostgreSQL, outside a transaction, this is one autocommit statement:
    one round trip and one commit for the lot (the turn loop batches what it
    appends between two external effects). Elsewhere, or when two of the
    events would update the same projection column, the events are inserted
    one by one inside a single transaction. With `guard` (see GUARDS)
    the batch is written only if the session row meets it, decided under the
    append's own row lock; an empty list means it did not, and nothing was
    written."""
    sid = uuid.UUID(str(session_id))
    if not items:
        return []
    if len(items) == 1 and guard is None:
        return [append(sid, items[0][0], items[0][1], fence=fence)]
    return _append_many(sid, items, fence, guard, release=False)[0]


# The session's head as a releasing append leaves it (see append_releasing).
HEAD_COLUMNS = ("open_turn_seq", "pending_approvals", "inbox_seq", "last_input_seq")


def append_releasing(
    session_id: uuid.UUID | str,
    items: list[tuple[str, dict[str, Any]]],
    *,
    fence: Fence,
    guard: Guard | None = None,
) -> tuple[list[AppendedEvent], tuple[Any, ...] | None]:
    """append_many that also gives up the lease `fence` holds, in the same
    commit (a turn's last batch: on Postgres one statement instead of two).
    Returns the events and the session's HEAD_COLUMNS as left; ([], None)
    when the guard failed, in which case the lease is still held."""
    return _append_many(uuid.UUID(str(session_id)), items, fence, guard, release=True)


def _check(items: list[tuple[str, dict[str, Any]]], guard: Guard | None) -> None:
    if guard is not None:
        _guard_sql(guard)  # fail before writing anything
    for kind, data in items:
        catalogue.validate(kind, data)


def _append_many(
    sid: uuid.UUID, items: list[tuple[str, dict[str, Any]]], fence: Fence | None, guard: Guard | None, *, release: bool
) -> tuple[list[AppendedEvent], tuple[Any, ...] | None]:
    if not items:
        return [], None
    _check(items, guard)
    if release and fence is None:
        raise ValueError("a releasing append needs the lease's fence")
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        statement = _batch_statement(sid, items, fence, guard, release)
        if statement is not None:
            return _append_batch_autocommit(sid, items, statement, fence, guard, release)
    return _append_batch_atomic(sid, items, fence, guard, release)


def _append_batch_atomic(
    sid: uuid.UUID,
    items: list[tuple[str, dict[str, Any]]],
    fence: Fence | None,
    guard: Guard | None = None,
    release: bool = False,
) -> tuple[list[AppendedEvent], tuple[Any, ...] | None]:
    track = not connection.in_atomic_block
    events: list[AppendedEvent] = []
    head: tuple[Any, ...] | None = None
    now = timezone.now()
    try:
        with transaction.atomic():
            for i, (kind, data) in enumerate(items):
                # The first insert takes the row lock; the guard is decided there.
                event = _insert_if(sid, kind, data, fence, guard if i == 0 else None, now)
                if event is None:
                    return [], None
                if track:
                    dispatcher.reserve(sid, event.seq)
                events.append(event)
                transaction.on_commit(lambda e=event: _after_commit(e), robust=True)  # type: ignore[misc]
            if release and fence is not None:
                with connection.cursor() as cur:
                    cur.execute(
                        f"UPDATE {_SESSION} SET lease_owner = '', lease_expires_at = NULL "
                        f"WHERE id = %s AND lease_gen = %s RETURNING {', '.join(HEAD_COLUMNS)}",
                        [sid if connection.vendor == "postgresql" else sid.hex, fence.gen],
                    )
                    head = cur.fetchone()
    except BaseException:
        if track:
            dispatcher.release(sid, [e.seq for e in events])
        raise
    return events, head


def _batch_statement(
    sid: uuid.UUID,
    items: list[tuple[str, dict[str, Any]]],
    fence: Fence | None,
    guard: Guard | None = None,
    release: bool = False,
) -> tuple[str, list[Any], list[str], datetime] | None:
    """The single UPDATE-then-INSERT statement for a batch, or None when the
    events' projections collide (Postgres refuses two assignments to one
    column, and two upserts of one row, in a single statement)."""
    now = timezone.now()
    n = len(items)
    parts = [f"last_seq = last_seq + {n}", "last_event_at = %s"]
    params: list[Any] = [now]
    columns: set[str] = set()
    extras: list[catalogue.Assignment] = []
    payloads: list[str] = []
    for i, (kind, data) in enumerate(items, start=1):
        spec, payload = _prepare(kind, data)
        payloads.append(payload)
        for sql, p in spec.project(data) if spec.project is not None else []:
            column = sql.split("=", 1)[0].strip()
            if column in columns:
                return None
            columns.add(column)
            parts.append(sql.replace("NEW_SEQ", f"last_seq + {i}"))
            params.extend(p)
        if spec.extra is not None:
            if extras:
                return None
            extras = spec.extra(data)  # noqa: S610
    if release:
        parts += ["lease_owner = ''", "lease_expires_at = NULL"]
    elif fence is not None:
        parts.append("lease_expires_at = %s")
        params.append(now + timedelta(seconds=fence.ttl))
    where = "id = %s"
    params.append(sid)
    if fence is not None:
        where += " AND lease_gen = %s"
        params.append(fence.gen)
    if guard is not None:
        guard_sql, guard_params = _guard_sql(guard)
        where += f" AND {guard_sql}"
        params.extend(guard_params)
    returning, ctes, extra_params = _extra_ctes(extras, now)
    params.extend(extra_params)
    values = ", ".join("(%s::int, %s::text, %s::text)" for _ in items)
    for i, ((kind, _), payload) in enumerate(zip(items, payloads, strict=True), start=1):
        params.extend([i, kind, payload])
    params.extend([sid, now])
    insert = (
        f"INSERT INTO {_EVENT} (session_id, seq, kind, data, created_at) "
        f"SELECT %s, s.last_seq - {n} + v.i, v.kind, v.data::jsonb, %s FROM s, (VALUES {values}) AS v(i, kind, data) "
        "RETURNING seq"
    )
    if release:
        # The session's head as left rides out with the seqs.
        returning += ", " + ", ".join(HEAD_COLUMNS)
        insert = f"ins AS ({insert}) SELECT ins.seq, {', '.join(f's.{c}' for c in HEAD_COLUMNS)} FROM ins, s"
        ctes += ","
    update = f"UPDATE {_SESSION} SET {', '.join(parts)} WHERE {where} RETURNING last_seq{returning}"
    sql = f"WITH s AS ({update}){ctes} {insert}"
    # The VALUES params come before the SELECT-list params in the text.
    head = params[: len(params) - 2 - 3 * n]
    tail_values = params[len(params) - 2 - 3 * n : len(params) - 2]
    select_params = params[len(params) - 2 :]
    return sql, [*head, *select_params, *tail_values], payloads, now


def _append_batch_autocommit(
    sid: uuid.UUID,
    items: list[tuple[str, dict[str, Any]]],
    statement: tuple[str, list[Any], list[str], datetime],
    fence: Fence | None,
    guard: Guard | None = None,
    release: bool = False,
) -> tuple[list[AppendedEvent], tuple[Any, ...] | None]:
    sql, params, _, now = statement
    events: list[AppendedEvent] = []
    dispatcher.begin(sid)
    try:
        rows = pg_rows(sql, params)
        seqs = sorted(int(row[0]) for row in rows)
        if not seqs:
            if guard is not None and _guard_failed(sid, fence):
                return [], None
            _raise_missing(sid, fence)
        events = [AppendedEvent(sid, seq, kind, data, now) for seq, (kind, data) in zip(seqs, items, strict=True)]
    finally:
        dispatcher.end_many(sid, events)
    from sessions_app import hints

    hints.publish_event(sid, events[-1].seq)
    return events, (tuple(rows[0][1:]) if release else None)
