"""A process's liveness lock, in this process: the claim records it, a dead
process's leases are free at once, the poller reaps the dead and wakes what
they held, and a broken connection takes the same key again. PostgreSQL only
(on SQLite liveness is off and leases are freed by their expiry)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from sessions_app import services
from sessions_app.models import Session, WorkerProcess
from sessions_app.runtime import lease, liveness
from sessions_app.runtime.sweep import sweep
from tests.helpers import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def woken() -> Iterator[list[str]]:
    """Liveness started in this process; the session ids its poller wakes."""
    ids: list[str] = []
    assert liveness.start(ids.append)
    yield ids
    liveness.stop()


def other_process() -> psycopg.Connection[Any]:
    """A connection standing in for another worker process's liveness connection."""
    return psycopg.connect(**liveness.conninfo(), autocommit=True)


def hold(conn: psycopg.Connection[Any], key: int) -> None:
    assert conn.execute("SELECT pg_try_advisory_lock(%s, %s)", [liveness.NS, key]).fetchone() == (True,)


def held_by(session: Session, key: int | None, *, expires_in: float = 30.0, **fields: Any) -> None:
    """As if a process with liveness key `key` had claimed the session's lease."""
    Session.objects.filter(id=session.id).update(
        lease_owner="elsewhere:1:1:x",
        lease_gen=99,
        lease_expires_at=timezone.now() + timedelta(seconds=expires_in),
        lease_process=key,
        **fields,
    )


def claim(session: Session) -> lease.Lease | None:
    """A claim, kept away from the keeper (these tests hold no turn)."""
    got = lease.claim(session.id)
    if got is not None:
        lease.keeper.drop(got)
    return got


def open_turn(session: Session) -> None:
    services.inject(session.id, "hi", wake=True)  # manual worker: the turn opens, nobody drives it
    session.refresh_from_db()
    assert session.open_turn_seq is not None


def test_start_holds_a_key_and_registers_the_process(woken: list[str]) -> None:
    key = liveness.current_key()
    assert key is not None
    row = WorkerProcess.objects.get(key=key)
    assert row.pid == os.getpid()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s "
            "AND objsubid = 2 AND granted",
            [liveness.NS, key],
        )
        assert cur.fetchone() == (1,)
    assert liveness.start(woken.append), "a second start is a no-op"
    assert liveness.current_key() == key


def test_a_claim_records_the_claimers_key_and_the_release_clears_it(woken: list[str], session: Session) -> None:
    got = claim(session)
    assert got is not None
    assert Session.objects.get(id=session.id).lease_process == liveness.current_key()
    lease.release(got)
    assert Session.objects.get(id=session.id).lease_process is None


def test_a_lease_of_a_live_process_holds_and_of_a_dead_one_is_free_at_once(session: Session) -> None:
    other = other_process()
    hold(other, 4242)
    held_by(session, 4242)
    assert claim(session) is None, "its process lives: the lease holds until it expires"
    other.close()  # the process dies: PostgreSQL frees its lock
    wait_for(lambda: claim(session), what="the dead process's lease to be claimable")


def test_a_held_lease_without_a_key_waits_for_its_expiry(session: Session) -> None:
    held_by(session, None)
    assert claim(session) is None
    held_by(session, None, expires_in=-1)
    assert claim(session) is not None


def test_the_poller_reaps_a_dead_process_and_wakes_what_it_held(
    woken: list[str], session: Session, make_user: Any, profile: Any
) -> None:
    blocked, alive = (services.create_session(make_user(), profile) for _ in range(2))
    for s in (session, blocked, alive):
        open_turn(s)
    mine = liveness.current_key()
    assert mine is not None
    other = other_process()
    hold(other, 777)
    WorkerProcess.objects.create(key=777, host="elsewhere", pid=1)
    WorkerProcess.objects.create(key=778, host="elsewhere", pid=2)  # long dead, held nothing
    held_by(session, 777)
    held_by(blocked, 777, blocked_seq=1)
    held_by(alive, mine)
    assert liveness.poll_now() == []
    assert set(WorkerProcess.objects.values_list("key", flat=True)) == {777, mine}
    other.close()
    wait_for(lambda: str(session.id) in woken, what="the dead process's session woken")
    assert not WorkerProcess.objects.filter(key=777).exists(), "its row is reaped"
    assert str(blocked.id) not in woken, "a blocked turn waits for a stimulus, not a worker"
    assert str(alive.id) not in woken
    assert WorkerProcess.objects.filter(key=mine).exists()


def test_the_sweep_takes_a_dead_process_turn_but_not_a_live_one(session: Session, make_user: Any, profile: Any) -> None:
    waiting = services.create_session(make_user(), profile)
    for s in (session, waiting):
        open_turn(s)
    other = other_process()
    hold(other, 901)
    held_by(session, 901)
    held_by(waiting, 902, waiting_seq=1)  # 902: nobody holds it
    assert str(session.id) not in sweep()
    other.close()
    wait_for(lambda: str(session.id) in sweep(), what="the sweep to see the dead process")
    assert str(waiting.id) not in sweep(), "a session waiting for an agent slot is not swept"


def liveness_backends() -> list[int]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'terret-liveness' "
            "AND datname = current_database()"
        )
        return [pid for (pid,) in cur.fetchall()]


def test_a_broken_connection_takes_the_same_key_again(woken: list[str]) -> None:
    key = liveness.current_key()
    assert key is not None
    (before,) = liveness_backends()
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [before])
    wait_for(lambda: liveness_backends() not in ([], [before]), timeout=10, what="a new liveness connection")
    wait_for(lambda: liveness.current_key() == key, timeout=10, what="the same key taken again")
    assert WorkerProcess.objects.filter(key=key, pid=os.getpid()).exists()


def test_stop_gives_the_key_up(session: Session) -> None:
    assert liveness.start(lambda _sid: None)
    key = liveness.current_key()
    assert key is not None
    liveness.stop()
    assert liveness.current_key() is None
    assert not WorkerProcess.objects.filter(key=key).exists()
    other = other_process()
    hold(other, key)  # the lock is free again
    other.close()
