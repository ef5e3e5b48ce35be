"""Session leases with fencing.

A worker drives a session only while it holds the lease. Every claim bumps
`lease_gen`; the turn code carries that generation as a Fence and every one of
its appends re-checks it under the session row lock (see log.append), so a
worker whose lease was taken over can append nothing more.

A process-wide keeper thread renews held leases while a turn waits on a model
or a tool, when no append would renew them.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from sessions_app.events import MODEL_ROLES
from sessions_app.log import HEAD_COLUMNS, Fence, SessionNotFound, pg_rows
from sessions_app.models import Agent, AgentProfile, Event, Session
from sessions_app.selectors import TURN_VIEW_KINDS, turn_view_filter

log = logging.getLogger(__name__)

_SESSION = Session._meta.db_table


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Head:
    """What a claim or a release saw of the session, under its row lock."""

    open_turn_seq: int | None
    pending_approvals: int
    inbox_seq: int
    last_input_seq: int

    @property
    def input_pending(self) -> bool:
        return self.last_input_seq > self.inbox_seq


@dataclass(frozen=True)
class Driving:
    """What the new owner needs to drive the session, read by the claim's own
    statement rather than by one query each: the live agent's profile (None:
    no live agent), the latest compaction's seq, whether the session has a
    title, the session's model-role overrides (model/updated) and the seq of
    its policy/updated in force."""

    profile: AgentProfile | None
    compacted_seq: int | None
    titled: bool
    overrides: dict[str, str]
    policy_seq: int | None = None


def driving_from_row(profile: AgentProfile | None, row: dict[str, Any]) -> Driving:
    """Driving from a row read under the session lock (log.locked's tx.row)."""
    overrides = {role: row[f"model_{role}"] for role in MODEL_ROLES if row[f"model_{role}"]}
    return Driving(profile, row["compacted_seq"], bool(row["title"]), overrides, row["policy_seq"])


@dataclass
class Lease:
    session_id: uuid.UUID
    owner: str
    gen: int
    ttl: float
    head: Head
    driving: Driving
    lost: threading.Event = field(default_factory=threading.Event)
    # When this process last pushed the expiry out (claim, renewal): the
    # keeper renews only leases that are a third of their ttl old.
    renewed_at: float = field(default_factory=time.monotonic)
    # The open turn's view (selectors.turn_view's rows) when the claim could
    # read it in its own statement; the runner's load takes it once.
    view: list[tuple[int, str, dict[str, Any]]] | None = None

    def take_view(self, turn_seq: int) -> list[tuple[int, str, dict[str, Any]]] | None:
        view, self.view = self.view, None
        return view if view is not None and self.head.open_turn_seq == turn_seq else None

    @property
    def fence(self) -> Fence:
        return Fence(self.gen, self.ttl)


_HEAD = ", ".join(HEAD_COLUMNS)
_DRIVING = "compacted_seq, title, policy_seq, " + ", ".join(f"model_{role}" for role in MODEL_ROLES)
_AGENT = Agent._meta.db_table
_PROFILE = AgentProfile._meta.db_table
_PROFILE_FIELDS = AgentProfile._meta.concrete_fields
_PROFILE_COLUMNS = ", ".join(f"p.{f.column}" for f in _PROFILE_FIELDS)


def _params(*values: Any) -> list[Any]:
    """Adapt for the backend: SQLite keeps UUIDs as hex text and needs
    Django's datetime adaptation; psycopg takes both natively."""
    if connection.vendor == "postgresql":
        return list(values)
    out: list[Any] = []
    for v in values:
        if isinstance(v, uuid.UUID):
            out.append(v.hex)
        elif isinstance(v, datetime):
            out.append(connection.ops.adapt_datetimefield_value(v))
        else:
            out.append(v)
    return out


def claim(session_id: uuid.UUID, *, ttl: float | None = None) -> Lease | None:
    """Take the session's lease if it is free or expired; None if someone holds it."""
    ttl = settings.TERRET_LEASE_SECONDS if ttl is None else ttl
    me = owner_id()
    now = timezone.now()
    # One conditional UPDATE (autocommitted): its row lock makes the test and
    # the generation bump atomic, so two claimers cannot both win, and it
    # returns the state the new owner starts from. On Postgres the agent and
    # its profile ride along in the same statement.
    update = (
        f"UPDATE {_SESSION} SET lease_gen = lease_gen + 1, lease_owner = %s, lease_expires_at = %s "
        "WHERE id = %s AND (lease_owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= %s) "
        f"RETURNING id, lease_gen, {_HEAD}, {_DRIVING}, last_seq"
    )
    params = _params(me, now + timedelta(seconds=ttl), session_id, now)
    width = 6 + 3 + len(MODEL_ROLES) + 1  # the RETURNING list; last_seq is its last
    view: list[tuple[int, str, dict[str, Any]]] | None = None
    profile_row: tuple[Any, ...] | None = None
    if connection.vendor == "postgresql":
        rows = pg_rows(
            f"WITH c AS ({update}) SELECT c.*, {_PROFILE_COLUMNS}, {_VIEW} FROM c "
            f"LEFT JOIN {_AGENT} a ON a.session_id = c.id LEFT JOIN {_PROFILE} p ON p.id = a.profile_id",
            [*params, *TURN_VIEW_KINDS],
        )
        row = rows[0] if rows else None
        if row is not None:
            profile_row = row[width:-1]
            view = _claimed_view(row[-1], row[width - 1])
    else:
        with connection.cursor() as cur:
            cur.execute(update, params)
            row = cur.fetchone()
            if row is not None:
                cur.execute(
                    f"SELECT {_PROFILE_COLUMNS} FROM {_AGENT} a JOIN {_PROFILE} p ON p.id = a.profile_id "
                    "WHERE a.session_id = %s",
                    _params(session_id),
                )
                profile_row = cur.fetchone()
    if row is None:
        if not Session.objects.filter(id=session_id).exists():
            raise SessionNotFound(f"no session {session_id}")
        return None
    overrides = {role: spec for role, spec in zip(MODEL_ROLES, row[9 : width - 1], strict=True) if spec}
    driving = Driving(_profile(profile_row), row[6], bool(row[7]), overrides, row[8])
    lease = Lease(session_id, me, int(row[1]), ttl, Head(row[2], row[3], row[4], row[5]), driving, view=view)
    keeper.hold(lease)
    return lease


# Postgres: the open turn's view (selectors.turn_view) read by the claim's
# own statement, saving the load's round trip. Its subquery sees the
# statement's snapshot, which predates the row version the UPDATE locked if
# the claim waited on the row lock; then the newest events may be missing,
# so the view is used only if it reaches the row's last_seq (events commit
# in seq order under that lock, so the rest is there too).
_VIEW = (
    "CASE WHEN c.open_turn_seq IS NULL THEN NULL ELSE (SELECT json_agg(json_build_array(e.seq, e.kind, e.data) "
    f"ORDER BY e.seq) FROM {Event._meta.db_table} e "
    f"WHERE {turn_view_filter('c.id', 'COALESCE(c.compacted_seq, 0)', 'c.open_turn_seq', alias='e')}) END"
)


def _claimed_view(rows: list[list[Any]] | None, last_seq: int) -> list[tuple[int, str, dict[str, Any]]] | None:
    if not rows or int(rows[-1][0]) != last_seq:
        return None
    return [(int(seq), kind, data) for seq, kind, data in rows]


def _profile(values: tuple[Any, ...] | None) -> AgentProfile | None:
    """An AgentProfile from raw columns, converted as the ORM would."""
    if values is None or values[0] is None:
        return None
    converted = []
    for (col, converters), value in zip(_profile_converters(), values, strict=True):
        for convert in converters:
            value = convert(value, col, connection)
        converted.append(value)
    return AgentProfile.from_db(connection.alias, [f.attname for f in _PROFILE_FIELDS], converted)


@functools.cache
def _profile_converters() -> list[tuple[Any, list[Any]]]:
    """Per profile column: the ORM's converters (backend's, then field's)."""
    out = []
    for f in _PROFILE_FIELDS:
        col = f.get_col(_PROFILE)
        out.append((col, [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)]))
    return out


def release(lease: Lease, *, retry_after: float | None = None) -> Head | None:
    """Give the lease up; returns the session's head as it was left, or None
    when the lease had already been taken over. With retry_after, the sweep
    leaves the session alone for that long (a failed resume backs off); a new
    stimulus may still claim it."""
    keeper.drop(lease)
    expires = timezone.now() + timedelta(seconds=retry_after) if retry_after else None
    sql = (
        f"UPDATE {_SESSION} SET lease_owner = '', lease_expires_at = %s WHERE id = %s AND lease_gen = %s "
        f"RETURNING {_HEAD}"
    )
    params = _params(expires, lease.session_id, lease.gen)
    if connection.vendor == "postgresql":
        rows = pg_rows(sql, params)
        row = rows[0] if rows else None
    else:
        with connection.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
    return Head(row[0], row[1], row[2], row[3]) if row else None


def released(lease: Lease, head: tuple[Any, ...]) -> Head:
    """The lease was given up by its holder's last append (log.append_releasing)."""
    keeper.drop(lease)
    return Head(*head)


def renew_many(held: list[Lease]) -> list[Lease]:
    """Push out the expiry of every lease still ours, one statement per ttl
    and 100 leases; returns those renewed and flags the others lost."""
    by_ttl: dict[float, list[Lease]] = {}
    for lease in held:
        by_ttl.setdefault(lease.ttl, []).append(lease)
    renewed: list[Lease] = []
    for ttl, same in by_ttl.items():
        for start in range(0, len(same), 100):
            renewed += _renew_chunk(same[start : start + 100], ttl)
    return renewed


def _renew_chunk(chunk: list[Lease], ttl: float) -> list[Lease]:
    pairs = ", ".join("(%s, %s)" for _ in chunk)
    params: list[Any] = _params(timezone.now() + timedelta(seconds=ttl))
    for lease in chunk:
        params.extend(_params(lease.session_id, lease.gen))
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_SESSION} SET lease_expires_at = %s WHERE (id, lease_gen) IN (VALUES {pairs}) "
            "RETURNING id, lease_gen",
            params,
        )
        ours = {(uuid.UUID(str(sid)), int(gen)) for sid, gen in cur.fetchall()}
    at = time.monotonic()
    renewed = []
    for lease in chunk:
        if (lease.session_id, lease.gen) in ours:
            lease.renewed_at = at
            renewed.append(lease)
        else:
            lease.lost.set()
    return renewed


class _Keeper:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[uuid.UUID, int], Lease] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._next_at = 0.0  # when the keeper thread means to look next (monotonic)

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._held[(lease.session_id, lease.gen)] = lease
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="terret-lease-keeper", daemon=True)
                self._thread.start()
            # A lease due before the keeper's next look (a shorter ttl than
            # any it holds) must not wait for that look.
            if lease.renewed_at + lease.ttl / 3 < self._next_at:
                self._wake.set()

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop((lease.session_id, lease.gen), None)

    def _run(self) -> None:
        while True:
            with self._lock:
                leases = list(self._held.values())
            # An append renews the lease too (it sets the expiry), but the
            # keeper cannot see those; a lease a third of its ttl old is due.
            now = time.monotonic()
            due = [lease for lease in leases if now - lease.renewed_at >= lease.ttl / 3 - 0.05]
            if due:
                self._renew(due)
            with self._lock:
                self._next_at = min(
                    (lease.renewed_at + lease.ttl / 3 for lease in self._held.values()),
                    default=time.monotonic() + settings.TERRET_LEASE_SECONDS / 3,
                )
                delay = self._next_at - time.monotonic()
            self._wake.wait(max(delay, 0.05))
            self._wake.clear()

    def _renew(self, due: list[Lease]) -> None:
        try:
            renewed = {id(lease) for lease in renew_many(due)}
        except Exception:
            log.exception("renewing %d leases failed", len(due))
            return  # not known to be lost; the next look tries again
        finally:
            connection.close()
        for lease in due:
            if id(lease) not in renewed:
                log.warning("lease on %s (gen %s) was taken over", lease.session_id, lease.gen)
                self.drop(lease)


keeper = _Keeper()
