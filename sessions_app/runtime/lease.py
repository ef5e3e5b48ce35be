"""Session leases with fencing.

A worker drives a session only while it holds the lease. Every claim bumps
`lease_gen`; the turn code carries that generation as a Fence and every one of
its appends re-checks it under the session row lock (see log.append), so a
worker whose lease was taken over can append nothing more.

A process-wide keeper thread renews held leases while a turn waits on a model
or a tool, when no append would renew them.

A claim also records the claiming process's liveness key (runtime/liveness.py
registers where it comes from): on PostgreSQL a lease whose process is gone
may be claimed at once, without waiting for it to expire.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from sessions_app.log import leases as statements
from sessions_app.log.catalogue import BUDGETS, MODEL_ROLES
from sessions_app.log.reads import ViewRow
from sessions_app.log.records import Fence, Workload
from sessions_app.models import AgentProfile

log = logging.getLogger(__name__)

# The liveness SQL, for the runtime's other readers of leases (sweep, liveness).
LIVENESS_NS = statements.LIVENESS_NS
process_gone = statements.process_gone


def _no_process_key() -> int | None:
    return None


_process_key: Callable[[], int | None] = _no_process_key


def use_process_key(source: Callable[[], int | None]) -> None:
    """Where claims read this process's liveness key from (liveness.current_key)."""
    global _process_key
    _process_key = source


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"


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
    # Whether the session has a budget of its own (budget/updated), so the
    # runner knows whether checking it costs a read (runtime/limits.py).
    budgeted: bool = False
    # An operator's hold on the session itself (session/suspended, session/revoked).
    suspended: bool = False
    revoked: bool = False
    # The agent version the session runs under (its open turn's): the turn
    # is driven with that version's profile (runtime/versions.py).
    version: int | None = None
    # The newest event versions in its log above 1 (Session.event_versions):
    # runtime/codever.py decides whether this code can read them.
    event_versions: Any = None
    # The session whose subagent this one is (Session.parent_session; None: a root).
    parent: Any = None


def driving_from_row(profile: AgentProfile | None, row: dict[str, Any]) -> Driving:
    """Driving from a row read under the session lock (log.locked's tx.row)."""
    overrides = {role: row[f"model_{role}"] for role in MODEL_ROLES if row[f"model_{role}"]}
    budgeted = any(row[f"budget_{name}"] is not None for name in BUDGETS)
    return Driving(
        profile,
        row["compacted_seq"],
        bool(row["title"]),
        overrides,
        row["policy_seq"],
        budgeted,
        suspended=row["suspended_seq"] is not None,
        revoked=row["revoked_seq"] is not None,
        version=row["agent_version"],
        event_versions=row.get("event_versions"),
        parent=row.get("parent_session_id"),
    )


@dataclass
class Lease:
    session_id: uuid.UUID
    owner: str
    gen: int
    ttl: float
    workload: Workload
    driving: Driving
    lost: threading.Event = field(default_factory=threading.Event)
    # When this process last pushed the expiry out (claim, renewal): the
    # keeper renews only leases that are a third of their ttl old.
    renewed_at: float = field(default_factory=time.monotonic)
    # The open turn's view (reads.turn_view's rows) when the claim could
    # read it in its own statement; the runner's load takes it once.
    view: list[ViewRow] | None = None
    # The progress mark (runtime/progress.py): when the model stream last gave
    # text (time.time()) and the current model call's text chunks so far, set
    # by the streaming thread; the keeper writes it with its next renewal
    # when it moved, so a streamed token costs no write of its own.
    progress_at: float | None = None
    streamed: int = 0
    written: tuple[float | None, int] = field(default=(None, 0), init=False, repr=False)

    def model_call(self) -> None:
        """A model call starts: its text chunks are counted from zero."""
        self.streamed = 0

    def streamed_text(self) -> None:
        """The model stream gave text: progress (keep-alive comments are not)."""
        self.streamed += 1
        self.progress_at = time.time()

    def unwritten_progress(self) -> tuple[float, int] | None:
        """The progress mark, if it moved since the keeper last wrote it."""
        at, n = self.progress_at, self.streamed
        if at is None or (at, n) == self.written:
            return None
        return at, n

    def take_view(self, turn_seq: int) -> list[ViewRow] | None:
        view, self.view = self.view, None
        return view if view is not None and self.workload.open_turn_seq == turn_seq else None

    @property
    def fence(self) -> Fence:
        return Fence(self.gen, self.ttl)


def claim(session_id: uuid.UUID, *, ttl: float | None = None) -> Lease | None:
    """Take the session's lease if it is free or expired; None if someone holds it."""
    ttl = settings.TERRET_LEASE_SECONDS if ttl is None else ttl
    me = owner_id()
    now = timezone.now()
    won = statements.claim(session_id, me, now, now + timedelta(seconds=ttl), _process_key())
    if won is None:
        return None
    lease = Lease(session_id, me, won.gen, ttl, won.workload, driving_from_row(won.profile, won.driving), view=won.view)
    keeper.hold(lease)
    return lease


def release(lease: Lease, *, retry_after: float | None = None) -> Workload | None:
    """Give the lease up; returns the session's workload as it was left, or
    None when the lease had already been taken over. With retry_after, the
    sweep leaves the session alone for that long (a failed resume backs off);
    a new stimulus may still claim it."""
    keeper.drop(lease)
    expires = timezone.now() + timedelta(seconds=retry_after) if retry_after else None
    return statements.release(lease.session_id, lease.gen, expires=expires)


def released(lease: Lease, workload: Workload) -> Workload:
    """The lease was given up by its holder's last append (append_many(release=True))."""
    keeper.drop(lease)
    return workload


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
    marks = [lease.unwritten_progress() for lease in chunk]
    progress = {
        lease.session_id: (datetime.fromtimestamp(mark[0], UTC), mark[1])
        for lease, mark in zip(chunk, marks, strict=True)
        if mark is not None
    }
    held = [(lease.session_id, lease.gen) for lease in chunk]
    ours = statements.renew(held, timezone.now() + timedelta(seconds=ttl), progress)
    at = time.monotonic()
    renewed = []
    for lease, mark in zip(chunk, marks, strict=True):
        if (lease.session_id, lease.gen) in ours:
            lease.renewed_at = at
            if mark is not None:
                lease.written = mark
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
