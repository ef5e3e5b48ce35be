"""Find turns that nobody is driving.

An open turn that is not parked on an approval and whose lease has expired
(its worker died, or its broker message was lost) needs a driver. On
PostgreSQL so does one whose lease is held by a process that is gone (its
liveness lock is free: runtime/liveness.py), whatever the expiry says; the
liveness poller normally wakes those within a poll, and the sweep is what
catches a wake-up that got lost. The sweep runs when a worker starts and
periodically after that.

A blocked turn (turn/blocked) waits for a stimulus or an operator, a turn
with an attempt of unknown outcome (tool/unknown) for an operator, and a
session waiting for an agent slot (agent/waiting) for a slot; none needs a
worker, so the sweep leaves them alone.

A running turn whose holder is alive but has made no progress for
TERRET_STALL_SECONDS is reported once (turn/stalled; runtime/progress.py).
Each round also audits the effect ledgers of a few recently active
sessions (runtime/effects.py audit_recent), bounded by
TERRET_EFFECTS_AUDIT_BATCH; its findings are on /ops/ and /metrics.

An idle session whose input a budget holds (input/held) is offered again,
so a new UTC day lets a daily budget's held input run.

A turn that was admitted but never claimed has no lease at all. Its wake-up
is normally still on its way through the broker, so the periodic sweep
treats the admission as an implicit lease: such a turn is swept once its last
event is TERRET_LEASE_SECONDS old. Sweeping it at once would send a second
wake-up for every turn of a burst that the workers have not reached yet. The
first sweep of a starting process takes them all (`at_start`): an in-process
queue died with the process before it, and for a broker the cost is at most
a duplicate wake-up, which the lease makes harmless.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import BooleanField, F, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from sessions_app.models import Session
from sessions_app.runtime import codever, counters, effects, materialize, progress, registry, storage
from sessions_app.runtime.lease import process_gone

logger = logging.getLogger(__name__)

SWEEP_BATCH = 500
_GONE = process_gone(f"{Session._meta.db_table}.lease_process")


def sweep(*, at_start: bool = False) -> list[str]:
    now = timezone.now()
    unclaimed_since = now if at_start else now - timedelta(seconds=settings.TERRET_LEASE_SECONDS)
    unowned = (
        Q(lease_expires_at__lt=now)
        | Q(lease_expires_at__isnull=True, last_event_at__lte=unclaimed_since)
        | Q(lease_expires_at__isnull=True, last_event_at__isnull=True)
    )
    found = Session.objects.filter(
        open_turn_seq__isnull=False,
        pending_approvals=0,
        unknown_effects=0,
        waiting_tasks=0,
        blocked_seq__isnull=True,
        waiting_seq__isnull=True,
        suspended_seq__isnull=True,
    )
    if connection.vendor == "postgresql":
        # Last in the OR, so only a row whose lease is otherwise live reads
        # pg_locks (once per statement: the test is a hashed subplan).
        unowned |= Q(RawSQL(_GONE, [], output_field=BooleanField()))  # noqa: S611 - constant SQL
    ids = [str(i) for i in found.filter(unowned).values_list("id", flat=True)[:SWEEP_BATCH]]
    return _not_noted(ids) if at_start else _not_woken_lately(ids)


_woken: dict[str, float] = {}
_woken_lock = threading.Lock()


def note_woken(sid: str) -> None:
    """A wake-up this process sent outside a sweep: liveness's, for a session
    whose driver's process is gone. Sweeps leave the session to it for a
    lease period, as they leave their own: on a fresh worker's start the
    start sweep would otherwise send a second drive of the turn it is
    recovering, which finds it busy while sharing its first milliseconds."""
    with _woken_lock:
        _woken[sid] = time.monotonic()


def _not_noted(ids: list[str]) -> list[str]:
    """The start sweep's ids less those noted lately (note_woken); nothing recorded."""
    now = time.monotonic()
    ttl = settings.TERRET_LEASE_SECONDS
    with _woken_lock:
        return [sid for sid in ids if now - _woken.get(sid, -ttl) >= ttl]


def _not_woken_lately(ids: list[str]) -> list[str]:
    """The ids this process has not swept within TERRET_LEASE_SECONDS. A
    wake-up stuck behind a backlog of them leaves the row unchanged, so
    without this every round would queue one more duplicate per session:
    a burst larger than the workers could take in a lease period would
    multiply itself. One wake-up per session per lease period per process
    still recovers a lost one."""
    now = time.monotonic()
    ttl = settings.TERRET_LEASE_SECONDS
    with _woken_lock:
        for sid, at in list(_woken.items()):
            if now - at >= ttl:
                del _woken[sid]
        fresh = [sid for sid in ids if sid not in _woken]
        for sid in fresh:
            _woken[sid] = now
    return fresh


def held() -> list[str]:
    """Idle sessions whose input a budget holds: each is woken again (at most
    once a lease period per process), and its drive checks the budgets anew:
    a new UTC day, a raised limit, or still held (then it appends nothing)."""
    found = Session.objects.filter(
        held_seq__isnull=False, open_turn_seq__isnull=True, lease_owner="", suspended_seq__isnull=True
    )
    return _not_woken_lately([str(i) for i in found.values_list("id", flat=True)[:SWEEP_BATCH]])


def owed() -> list[str]:
    """Idle sessions owed a turn that nobody opened (a worker died between
    one turn's end and the next one's opening), once their lease, if any,
    has run out: by a follow-up, or by a woken steer that arrived as the
    last turn ended. Two statements, each on its own partial index
    (session_owed, session_woken): an OR of the two would be planned as a
    scan of the table."""
    now = timezone.now()
    idle = Session.objects.filter(
        open_turn_seq__isnull=True,
        held_seq__isnull=True,
        suspended_seq__isnull=True,
        revoked_seq__isnull=True,
    ).filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
    follow_ups = idle.filter(queued_follow_ups__gt=0)
    # The counter may stay up after a withdrawal behind an unwoken steer; the
    # cursors say whether any steer waits at all, and the drive reads which.
    steers = idle.filter(woken_steers__gt=0, last_input_seq__gt=F("inbox_seq"))
    ids = [str(i) for i in follow_ups.values_list("id", flat=True)[:SWEEP_BATCH]]
    ids += [str(i) for i in steers.values_list("id", flat=True)[:SWEEP_BATCH] if str(i) not in ids]
    return _not_woken_lately(ids)


def sweep_round(*, at_start: bool, wake: Callable[[str], None]) -> None:
    """One round of a worker's sweeper: turns nobody drives, idle agents,
    free agent slots, each woken with `wake`. Each part on its own, so one
    failing does not stop the others."""
    parts: list[tuple[str, Callable[[], list[str]]]] = [
        ("sweep", lambda: sweep(at_start=at_start)),
        ("offering held input", held),
        ("offering owed follow-ups", owed),
        ("re-driving turns this code reads again", codever.readable_again),
        ("reaping idle agents", _reap),
        ("offering agent slots", lambda: registry.offer_slots(wait=False)),
        ("reporting stalled turns", progress.report_stalls),
        ("auditing effect ledgers", _audit_effects),
        ("moving quiet sessions' storage", storage.move_quiet),
        ("removing gone processes' scratch directories", _sweep_scratch),
        ("counting the round", _count_round),
    ]
    for what, part in parts:
        try:
            for sid in part():
                wake(sid)
        except Exception:
            logger.exception("%s failed", what)
        finally:
            connection.close()


def _sweep_scratch() -> list[str]:
    # Copies of sessions' documents a killed process left on this host (runtime/materialize.py).
    materialize.sweep_orphans()
    return []


def _count_round() -> list[str]:
    """One more sweep round (terret_sweeps_total on /metrics), and this
    process's other counters since the last round, written (counters.py)."""
    counters.add("sweeps")
    counters.flush()
    return []


def _audit_effects() -> list[str]:
    """A bounded batch of recently active sessions' effect ledgers audited
    (effects.audit_recent); what it found is on /ops/ and /metrics."""
    audited, found = effects.audit_recent()
    counters.add("effects_audits", audited)
    counters.add("effects_audit_findings", found)
    return []


def _reap() -> list[str]:
    registry.reap_idle()
    return []  # a disposal wakes nobody; offering the slots it freed does
