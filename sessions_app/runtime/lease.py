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
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from sessions_app.log import Fence, SessionNotFound
from sessions_app.models import Session

log = logging.getLogger(__name__)


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"


@dataclass
class Lease:
    session_id: uuid.UUID
    owner: str
    gen: int
    ttl: float
    lost: threading.Event = field(default_factory=threading.Event)

    @property
    def fence(self) -> Fence:
        return Fence(self.gen, self.ttl)


def claim(session_id: uuid.UUID, *, ttl: float | None = None) -> Lease | None:
    """Take the session's lease if it is free or expired; None if someone holds it."""
    ttl = settings.TERRET_LEASE_SECONDS if ttl is None else ttl
    me = owner_id()
    now = timezone.now()
    with transaction.atomic():
        row = (
            Session.objects.select_for_update().filter(id=session_id).values("lease_owner", "lease_expires_at").first()
        )
        if row is None:
            raise SessionNotFound(f"no session {session_id}")
        held = row["lease_owner"] and row["lease_expires_at"] is not None and row["lease_expires_at"] > now
        if held:
            return None
        Session.objects.filter(id=session_id).update(
            lease_gen=F("lease_gen") + 1, lease_owner=me, lease_expires_at=now + timedelta(seconds=ttl)
        )
        gen = Session.objects.filter(id=session_id).values_list("lease_gen", flat=True).get()
    lease = Lease(session_id, me, gen, ttl)
    keeper.hold(lease)
    return lease


def release(lease: Lease, *, retry_after: float | None = None) -> None:
    """Give the lease up. With retry_after, the sweep leaves the session alone
    for that long (a failed resume backs off); a new stimulus may still claim it."""
    keeper.drop(lease)
    expires = timezone.now() + timedelta(seconds=retry_after) if retry_after else None
    Session.objects.filter(id=lease.session_id, lease_gen=lease.gen).update(lease_owner="", lease_expires_at=expires)


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
