"""Session leases with fencing.

A worker drives a session only while it holds the lease. Every claim bumps
`lease_gen`; the turn code carries that generation as a Fence and every one of
its appends re-checks it under the session row lock (see log.append), so a
worker whose lease was taken over can append nothing more.

A process-wide keeper thread renews held leases while a turn waits on a model
or a tool, when no append would renew them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from sessions_app.log import Fence, SessionNotFound
from sessions_app.models import Session

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


@dataclass
class Lease:
    session_id: uuid.UUID
    owner: str
    gen: int
    ttl: float
    head: Head
    lost: threading.Event = field(default_factory=threading.Event)

    @property
    def fence(self) -> Fence:
        return Fence(self.gen, self.ttl)


_HEAD = "open_turn_seq, pending_approvals, inbox_seq, last_input_seq"


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
    # One conditional UPDATE (one round trip, autocommitted): its row lock
    # makes the test and the generation bump atomic, so two claimers cannot
    # both win, and it returns the state the new owner starts from.
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_SESSION} SET lease_gen = lease_gen + 1, lease_owner = %s, lease_expires_at = %s "
            "WHERE id = %s AND (lease_owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= %s) "
            f"RETURNING lease_gen, {_HEAD}",
            _params(me, now + timedelta(seconds=ttl), session_id, now),
        )
        row = cur.fetchone()
    if row is None:
        if not Session.objects.filter(id=session_id).exists():
            raise SessionNotFound(f"no session {session_id}")
        return None
    lease = Lease(session_id, me, int(row[0]), ttl, Head(row[1], row[2], row[3], row[4]))
    keeper.hold(lease)
    return lease


def release(lease: Lease, *, retry_after: float | None = None) -> Head | None:
    """Give the lease up; returns the session's head as it was left, or None
    when the lease had already been taken over. With retry_after, the sweep
    leaves the session alone for that long (a failed resume backs off); a new
    stimulus may still claim it."""
    keeper.drop(lease)
    expires = timezone.now() + timedelta(seconds=retry_after) if retry_after else None
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_SESSION} SET lease_owner = '', lease_expires_at = %s WHERE id = %s AND lease_gen = %s "
            f"RETURNING {_HEAD}",
            _params(expires, lease.session_id, lease.gen),
        )
        row = cur.fetchone()
    return Head(row[0], row[1], row[2], row[3]) if row else None


def renew(lease: Lease) -> bool:
    n = Session.objects.filter(id=lease.session_id, lease_gen=lease.gen).update(
        lease_expires_at=timezone.now() + timedelta(seconds=lease.ttl)
    )
    if n == 0:
        lease.lost.set()
    return n == 1


class _Keeper:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[uuid.UUID, int], Lease] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._held[(lease.session_id, lease.gen)] = lease
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="terret-lease-keeper", daemon=True)
                self._thread.start()

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop((lease.session_id, lease.gen), None)

    def _run(self) -> None:
        while True:
            with self._lock:
                leases = list(self._held.values())
                interval = min((lease.ttl for lease in leases), default=settings.TERRET_LEASE_SECONDS) / 3
            self._wake.wait(max(interval, 0.1))
            for lease in leases:
                try:
                    if not renew(lease):
                        log.warning("lease on %s (gen %s) was taken over", lease.session_id, lease.gen)
                        self.drop(lease)
                except Exception:
                    log.exception("renewing lease on %s failed", lease.session_id)
            connection.close()


keeper = _Keeper()
