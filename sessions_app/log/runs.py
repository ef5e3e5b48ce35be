"""Turning a batch of events into runs, and a run into its SQL pieces.

A run is a stretch of a batch that one UPDATE-then-INSERT can write: its
events' projection updates touch distinct columns (neither backend applies
two assignments to one column in one UPDATE) and no two of them have extra
writes into the same table (the usage-day upsert, the metrics tallies). Most batches are one run. The pieces
here are standard SQL shared by both backends; each backend module wraps
them in its own statement(s).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from sessions_app.errors import InvalidPayload
from sessions_app.log import catalogue
from sessions_app.log.records import Fence
from sessions_app.log.sql import Sql
from sessions_app.validation import has_lone_surrogate

SESSION_TABLE = "sessions_app_session"
EVENT_TABLE = "sessions_app_event"

# Giving a lease up: the one place this assignment is written. Its parameter
# is the expiry left behind (None, or a retry-after that keeps the sweep away).
# The holder's liveness key goes with the lease (log/leases.py).
RELEASE_SET = "lease_owner = '', lease_expires_at = %s, lease_process = NULL"
# The same release for an ORM update (SessionTx.fence_out), kept beside it.
RELEASED = {"lease_owner": "", "lease_expires_at": None, "lease_process": None}

# A releasing append (a turn's last commit) also says whether any session
# waits for an agent slot, so the after-turn hook skips registry.offer_slots()
# and its own has_waiting() query when none does (services/post_turn.py):
# almost always. Uncorrelated: one InitPlan per statement, which on
# PostgreSQL reads the session_waiting partial index (EXPLAIN of the
# releasing append: "InitPlan 4 -> Index Only Scan using session_waiting on
# sessions_app_session"; a near-empty table is scanned instead). It sees the
# statement's snapshot: a session that starts waiting meanwhile may be
# missed, as it could be by the separate query before; the next turn's end
# or the sweep's offer_slots hands it a slot.
SLOTS_WANTED = f"EXISTS (SELECT 1 FROM {SESSION_TABLE} WHERE waiting_seq IS NOT NULL) AS slots_wanted"

# Conditions on the session row that a guarded append may demand, decided
# by the append's own row lock. A guard is a key, or (key, value).
GUARDS: dict[str, str] = {
    "untitled": "title = ''",
    # No open turn and nothing queued: a wake may open a turn with its own text only.
    "idle_empty_inbox": "open_turn_seq IS NULL AND last_input_seq <= inbox_seq AND deferred_seq <= deferred_cursor",
    # The same, on the given agent version (0: none yet): a turn opening on it moves the session nowhere.
    "idle_empty_inbox_at": "open_turn_seq IS NULL AND last_input_seq <= inbox_seq AND deferred_seq <= deferred_cursor "
    "AND COALESCE(agent_version, 0) = %s",
    # The policy in force is still the given policy/updated seq (0: none yet).
    "policy_at": "COALESCE(policy_seq, 0) = %s",
}
Guard = str | tuple[str, Any]
# At most one turn is open: every run that carries a turn/start is written
# only while the row has no open turn, decided by the run's own row lock (in
# the same WHERE as the fence and the guard: no statement of its own). A
# guarded batch that finds a turn open writes nothing, as for any failed
# guard; an unguarded one raises TurnAlreadyOpen (writer._nothing_written).
NO_OPEN_TURN = "open_turn_seq IS NULL"


def guard_sql(guard: Guard) -> Sql:
    """The guard's condition; ValueError for an unknown key or a wrong number of values."""
    name, *values = (guard,) if isinstance(guard, str) else guard
    sql = GUARDS.get(name)
    if sql is None:
        raise ValueError(f"unknown append guard {name!r}")
    if sql.count("%s") != len(values):
        raise ValueError(f"append guard {name!r} takes {sql.count('%s')} value(s)")
    return Sql(sql, *values)


@dataclass(frozen=True)
class Item:
    """One event, validated and serialized, ready to write."""

    kind: str
    data: dict[str, Any]
    spec: catalogue.Kind
    payload: str


def prepare(kind: str, data: dict[str, Any]) -> Item:
    """Validate (UnknownEventKind, InvalidPayload) and serialize; nothing is written yet."""
    spec = catalogue.validate(kind, data)
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    # Every event must fit one socket frame (the runtime cuts model output and
    # tool results to fit first: runtime/storable.py). A char is at most 4 bytes.
    limit = settings.TERRET_MAX_EVENT_BYTES
    if len(payload) * 4 > limit and len(payload.encode()) > limit:
        raise InvalidPayload(f"{kind}: the event is larger than {limit} bytes")
    if "\\u0000" in payload and catalogue.has_nul(data):
        # jsonb (and so the log on Postgres) cannot hold NUL; refuse on every
        # backend so both behave the same.
        raise InvalidPayload(f"{kind}: strings must not contain NUL characters")
    if has_lone_surrogate(payload):
        # UTF-8 cannot encode one: the driver would fail mid-write on either backend.
        raise InvalidPayload(f"{kind}: strings must not contain lone surrogates (\\ud800 to \\udfff)")
    return Item(kind, data, spec, payload)


def tally_shard(session_id: uuid.UUID | str) -> int:
    """Which of its profile's day tally rows a session's appends add to
    (TERRET_TALLY_SHARDS): always the same one, and spread across sessions."""
    sid = session_id if isinstance(session_id, uuid.UUID) else uuid.UUID(str(session_id))
    return sid.int % settings.TERRET_TALLY_SHARDS


@dataclass
class Run:
    session_id: uuid.UUID
    items: list[Item]
    now: datetime
    fence: Fence | None = None
    guard: Guard | None = None
    release: bool = False
    projections: list[Sql] = field(default_factory=list)
    extras: list[catalogue.Assignment] = field(default_factory=list)

    def set_sql(self, versions_set: str = "") -> Sql:
        """The UPDATE's SET list: seq, projections, the newest event versions
        (the backend's `versions_set`, only for events above version 1) and
        the lease's expiry."""
        parts = [
            Sql(f"last_seq = last_seq + {len(self.items)}"),
            Sql("last_event_at = %s", self.now),
            Sql("log_bytes = log_bytes + %s", self.nbytes),
        ]
        parts += self.projections
        versions = self.versions
        if versions:
            parts.append(Sql(versions_set, json.dumps(versions, separators=(",", ":"))))
        if self.release:
            parts.append(Sql(RELEASE_SET, None))
        elif self.fence is not None:
            parts.append(Sql("lease_expires_at = %s", self.now + timedelta(seconds=self.fence.ttl)))
        return Sql().join(", ", parts)

    def where_sql(self, session_param: Any) -> Sql:
        where = Sql("id = %s", session_param)
        if self.fence is not None:
            where.add(" AND lease_gen = %s", self.fence.gen)
        guard = guard_sql(self.guard) if self.guard is not None else None
        if guard is not None:
            where.add(" AND ").extend(guard)
        if self.opens_turn and (guard is None or NO_OPEN_TURN not in guard.text):
            where.add(f" AND {NO_OPEN_TURN}")
        return where

    @property
    def versions(self) -> dict[str, int]:
        """{kind: version} of the run's events written above version 1 (almost always none)."""
        return {e.kind: e.spec.version for e in self.items if e.spec.version > 1}

    @property
    def nbytes(self) -> int:
        """The UTF-8 bytes of the run's payloads (Session.log_bytes)."""
        return sum(len(e.payload) if e.payload.isascii() else len(e.payload.encode()) for e in self.items)

    @property
    def opens_turn(self) -> bool:
        return any(item.kind == "turn/start" for item in self.items)


def split(
    session_id: uuid.UUID,
    items: list[Item],
    now: datetime,
    fence: Fence | None,
    guard: Guard | None,
    release: bool,
) -> list[Run]:
    """The batch as runs, in order. Only the first run carries the guard
    (its row lock decides for the batch) and only the last one releases."""
    runs: list[Run] = []
    columns: set[str] = set()
    for item in items:
        assignments = item.spec.project(item.data) if item.spec.project is not None else []
        extras = item.spec.extra(item.data) if item.spec.extra is not None else []  # noqa: S610 - the catalogue's SQL
        names = {sql.split("=", 1)[0].strip() for sql, _ in assignments}
        run = runs[-1] if runs else None
        if run is None or names & columns or (_tables(extras) & _tables(run.extras)):
            run = Run(session_id, [], now, fence, guard if not runs else None)
            runs.append(run)
            columns = set()
        position = len(run.items) + 1
        run.items.append(item)
        columns |= names
        run.projections += [Sql(sql.replace("NEW_SEQ", f"last_seq + {position}"), *p) for sql, p in assignments]
        run.extras += extras
    if runs:
        runs[-1].release = release
    return runs


def _tables(extras: list[catalogue.Assignment]) -> set[str]:
    """The tables some extra writes upsert into: two upserts into one table
    in one statement may hit one row twice, which neither backend allows."""
    return {sql.split()[2] for sql, _ in extras}
