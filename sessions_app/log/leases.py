"""The lease columns of the session row: claim, release, renewal.

The runtime (runtime/lease.py) decides when to claim, renew and release;
these are the statements it runs, written once for both backends. A claim
is one conditional UPDATE (autocommitted): its row lock makes the test and
the generation bump atomic, so two claimers cannot both win, and it returns
what the new owner starts from. On PostgreSQL the live agent's profile and
the open turn's view ride along in the same statement.

On PostgreSQL a lease is also free when the process holding it is gone.
Every worker process holds a session-level advisory lock (LIVENESS_NS, its
key) on a connection of its own (runtime/liveness.py), and a claim records
the claimer's key in `lease_process`. PostgreSQL frees that lock the moment
the process dies (its socket closes), so a lease whose key is no longer
locked in this database may be taken over at once, long before it expires.
The expiry stays the fallback: for a host that vanished without closing its
sockets, for a process whose liveness connection is down, and on SQLite.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from sessions_app.errors import SessionNotFound
from sessions_app.log import backends
from sessions_app.log.catalogue import BUDGETS, MODEL_ROLES
from sessions_app.log.reads import TURN_VIEW_KINDS, ViewRow, turn_view_filter
from sessions_app.log.records import WORKLOAD_COLUMNS, Workload
from sessions_app.log.runs import EVENT_TABLE, RELEASE_SET, SESSION_TABLE
from sessions_app.log.sql import Sql
from sessions_app.log.upcasters import CannotLift, lift
from sessions_app.models import Agent, AgentProfile, Session

DRIVING_COLUMNS = (
    "compacted_seq",
    "title",
    "policy_seq",
    *(f"model_{role}" for role in MODEL_ROLES),
    *(f"budget_{name}" for name in BUDGETS),
    "suspended_seq",
    "revoked_seq",
    "agent_version",
    "event_versions",
    "parent_session_id",
)
_AGENT = Agent._meta.db_table
_PROFILE = AgentProfile._meta.db_table
_PROFILE_FIELDS = AgentProfile._meta.concrete_fields
# Profile columns in the claim's row, prefixed so they cannot collide with the session's.
_PROFILE_SELECT = ", ".join(f'p.{f.column} AS "p_{f.column}"' for f in _PROFILE_FIELDS)

# The open turn's view (reads.turn_view) read by the claim's own statement,
# saving the load's round trip. Its subquery sees the statement's snapshot,
# which predates the row version the UPDATE locked if the claim waited on the
# row lock; then the newest events may be missing, so the view is used only
# if it reaches the row's last_seq (events commit in seq order under that
# lock, so the rest is there too).
_VIEW_START = "LEAST(COALESCE(c.compacted_seq, 0), c.open_turn_seq)"  # as reads.turn_view
_VIEW = (
    "CASE WHEN c.open_turn_seq IS NULL THEN NULL ELSE "
    f"(SELECT json_agg(json_build_array(e.seq, e.kind, e.data, e.version) ORDER BY e.seq) FROM {EVENT_TABLE} e "
    f"WHERE {turn_view_filter('c.id', _VIEW_START, 'c.open_turn_seq', alias='e')}) END AS view"
)


# The first half of every liveness lock (pg_try_advisory_lock(int4, int4)); the
# two-key form shows in pg_locks as classid = the first, objid = the second,
# objsubid = 2, apart from the one-key (bigint) locks used elsewhere.
LIVENESS_NS = 0x7E57_A11E
# The liveness keys locked in this database right now.
HELD_KEYS = (
    "SELECT l.objid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    f"AND l.classid = {LIVENESS_NS} "
    "AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())"
)


def key_unlocked(column: str) -> str:
    """SQL: the liveness key in `column` (not NULL) is not locked, so its
    process is gone. Uncorrelated, so PostgreSQL reads pg_locks once per
    statement (a hashed subplan) however many rows it tests, and only once a
    row reaches the test."""
    return f"CAST({column} AS oid) NOT IN ({HELD_KEYS})"


def process_gone(column: str) -> str:
    """SQL: `column` holds the liveness key of a process that is gone (PostgreSQL only)."""
    return f"({column} IS NOT NULL AND {key_unlocked(column)})"


def _claimable(now: datetime) -> Sql:
    """The claim's test of the lease: free, expired, or (PostgreSQL) held by a
    process that is gone. The CASE decides in order, so the hot path (a free
    lease) never reads pg_locks: only a claim that would otherwise fail does."""
    free = "lease_owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= %s"
    if connection.vendor != "postgresql":
        return Sql(f"({free})", now)
    column = f"{SESSION_TABLE}.lease_process"
    return Sql(f"CASE WHEN {free} THEN true WHEN {column} IS NULL THEN false ELSE {key_unlocked(column)} END", now)


@dataclass(frozen=True)
class Claimed:
    """What a won claim returns: the new generation, the workload, the
    driving columns (DRIVING_COLUMNS), the live agent's profile (None: no
    live agent) and, where the backend read it, the open turn's view."""

    gen: int
    workload: Workload
    driving: dict[str, Any]
    profile: AgentProfile | None
    view: list[ViewRow] | None


def claim(
    session_id: uuid.UUID, owner: str, now: datetime, expires: datetime, process: int | None = None
) -> Claimed | None:
    """Take the lease if it is free, expired or its holder's process is gone;
    None if someone holds it. `process` is the claimer's liveness key (None:
    none, only the expiry frees this lease)."""
    backend = backends.current()
    update = Sql(
        f"UPDATE {SESSION_TABLE} SET lease_gen = lease_gen + 1, lease_owner = %s, lease_expires_at = %s, "
        "lease_process = %s ",
        owner,
        expires,
        process,
    )
    update.add("WHERE id = %s AND ", session_id).extend(_claimable(now)).add(" ")
    update.add(f"RETURNING id, lease_gen, last_seq, {', '.join(WORKLOAD_COLUMNS)}, {', '.join(DRIVING_COLUMNS)}")
    view: list[ViewRow] | None = None
    if backend.claim_extras:
        q = Sql("WITH c AS (").extend(update).add(f") SELECT c.*, {_PROFILE_SELECT}, {_VIEW} FROM c ", *TURN_VIEW_KINDS)
        q.add(f"LEFT JOIN {_AGENT} a ON a.session_id = c.id LEFT JOIN {_PROFILE} p ON p.id = a.profile_id")
        rows = backend.fetch(q.text, q.params)
        row = rows[0] if rows else None
        if row is not None:
            view = _claimed_view(row["view"], row["last_seq"])
    else:
        rows = backend.fetch(update.text, update.params)
        row = rows[0] if rows else None
        if row is not None:
            profile = f"SELECT {_PROFILE_SELECT} FROM {_AGENT} a JOIN {_PROFILE} p ON p.id = a.profile_id"
            found = backend.fetch(f"{profile} WHERE a.session_id = %s", [session_id])
            row.update(found[0] if found else {})
    if row is None:
        if not Session.objects.filter(id=session_id).exists():
            raise SessionNotFound(f"no session {session_id}")
        return None
    return Claimed(
        int(row["lease_gen"]),
        Workload.from_row(row),
        {c: row[c] for c in DRIVING_COLUMNS},
        _profile(row),
        view,
    )


def _claimed_view(rows: list[list[Any]] | None, last_seq: int) -> list[ViewRow] | None:
    if not rows or int(rows[-1][0]) != last_seq:
        return None
    try:
        return [(int(seq), kind, lift(kind, version, data)) for seq, kind, data, version in rows]
    except CannotLift:
        return None  # a log newer than this code reads: the drive leaves it unread (runtime/codever.py)


def _profile(row: dict[str, Any]) -> AgentProfile | None:
    """An AgentProfile from the claim's p_ columns, converted as the ORM would."""
    if row.get(f"p_{_PROFILE_FIELDS[0].column}") is None:
        return None
    values = []
    for f, (col, converters) in zip(_PROFILE_FIELDS, _profile_converters(), strict=True):
        value = row[f"p_{f.column}"]
        for convert in converters:
            value = convert(value, col, connection)
        values.append(value)
    return AgentProfile.from_db(connection.alias, [f.attname for f in _PROFILE_FIELDS], values)


@functools.cache
def _profile_converters() -> list[tuple[Any, list[Any]]]:
    """Per profile column: the ORM's converters (backend's, then field's)."""
    out = []
    for f in _PROFILE_FIELDS:
        col = f.get_col(_PROFILE)
        out.append((col, [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)]))
    return out


def release(session_id: uuid.UUID, gen: int, *, expires: datetime | None = None) -> Workload | None:
    """Give the lease up; the workload as left, or None when generation `gen`
    had already been superseded. `expires` (a retry-after) keeps the sweep
    away that long."""
    q = Sql(f"UPDATE {SESSION_TABLE} SET {RELEASE_SET} WHERE id = %s AND lease_gen = %s ", expires, session_id, gen)
    q.add(f"RETURNING {', '.join(WORKLOAD_COLUMNS)}")
    rows = backends.current().fetch(q.text, q.params)
    return Workload.from_row(rows[0]) if rows else None


def renew(
    held: list[tuple[uuid.UUID, int]],
    expires: datetime,
    progress: dict[uuid.UUID, tuple[datetime, int]] | None = None,
) -> set[tuple[uuid.UUID, int]]:
    """Push out the expiry of the leases (session, generation) still held;
    returns those that were. `progress` rides along: per session, the
    holder's progress mark (when its model stream last gave text, and how
    many text chunks its current model call has streamed), for the sessions
    whose mark moved since the last renewal (runtime/progress.py)."""
    q = Sql(f"UPDATE {SESSION_TABLE} SET lease_expires_at = %s", expires)
    if progress:
        q.add(", progress_at = CASE id").join(
            "", (Sql(" WHEN %s THEN %s", sid, at) for sid, (at, _) in progress.items())
        )
        q.add(" ELSE progress_at END, streamed_tokens = CASE id")
        q.join("", (Sql(" WHEN %s THEN %s", sid, n) for sid, (_, n) in progress.items()))
        q.add(" ELSE streamed_tokens END")
    q.add(" WHERE (id, lease_gen) IN (VALUES ")
    q.join(", ", (Sql("(%s, %s)", sid, gen) for sid, gen in held))
    q.add(") RETURNING id, lease_gen")
    # Not prepared: its shape changes with the number of leases.
    rows = backends.current().fetch_unprepared(q.text, q.params)
    return {(uuid.UUID(str(r["id"])), int(r["lease_gen"])) for r in rows}
