"""The lease claim, its batched renewal, and the sweep's view of leases.
Runs on both databases."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from sessions_app import log, services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime import lease
from sessions_app.runtime.sweep import note_woken, sweep

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def profile() -> AgentProfile:
    return AgentProfile.objects.create(
        name="lease-t",
        roles={"main": "test/main", "titler": "test/titler"},
        builtin_tools=["clock.now"],
        allow_floor=["clock.*"],
        approvals={"clock.now": "always"},
        compaction_budget=1234,
        system_prompt="be brief",
    )


def claimed(session_id: Any) -> lease.Lease:
    got = lease.claim(session_id)
    assert got is not None
    lease.keeper.drop(got)
    return got


def test_the_claim_brings_the_agent_profile_as_the_orm_would(session: Session, profile: AgentProfile) -> None:
    got = claimed(session.id)
    p = got.driving.profile
    assert p is not None and p.pk == profile.pk
    for field in AgentProfile._meta.concrete_fields:
        assert getattr(p, field.attname) == getattr(profile, field.attname), field.name
    assert p._state.adding is False
    assert got.driving.compacted_seq is None and got.driving.titled is False and got.driving.overrides == {}
    lease.release(got)


def test_the_claim_brings_overrides_title_and_compaction(session: Session) -> None:
    services.set_model(session.id, "main", "other/main")
    services.set_model(session.id, "compactor", "other/compactor")
    services.set_model(session.id, "main", "latest/main")
    log.append(session.id, "session/titled", {"title": "Named"})
    compacted = log.append(session.id, "session/compacted", {"upto_seq": 4, "summary": "so far"})
    got = claimed(session.id)
    assert got.driving.overrides == {"main": "latest/main", "compactor": "other/compactor"}
    assert got.driving.titled is True
    assert got.driving.compacted_seq == compacted.seq
    lease.release(got)


def test_a_session_without_a_live_agent_claims_with_no_profile(session: Session) -> None:
    agent = session.agent  # type: ignore[attr-defined]
    services.dispose_agent(agent.agent_id)
    got = claimed(session.id)
    assert got.driving.profile is None
    lease.release(got)


def test_renew_many_extends_ours_and_flags_the_taken_over(session: Session, make_user: Any, profile: Any) -> None:
    other = services.create_session(make_user(), profile)
    a, b = claimed(session.id), claimed(other.id)
    # b is taken over: its generation moves on behind its back.
    Session.objects.filter(id=other.id).update(lease_gen=b.gen + 1)
    before = Session.objects.get(id=session.id).lease_expires_at
    threading.Event().wait(0.05)
    renewed = lease.renew_many([a, b])
    assert renewed == [a]
    assert not a.lost.is_set() and b.lost.is_set()
    assert Session.objects.get(id=session.id).lease_expires_at > before
    lease.release(a)


def test_the_keeper_renews_a_held_lease_before_it_lapses(session: Session) -> None:
    held = lease.claim(session.id, ttl=0.6)
    assert held is not None
    try:
        threading.Event().wait(1.0)  # past the ttl: only renewals keep it ours
        assert lease.claim(session.id) is None
        assert not held.lost.is_set()
    finally:
        lease.release(held)


def test_sweep_leaves_an_unclaimed_turn_alone_for_one_lease_period(session: Session, settings: Any) -> None:
    settings.TERRET_LEASE_SECONDS = 30.0
    services.inject(session.id, "hello", wake=True)  # admitted; its wake-up is on its way
    assert str(session.id) not in sweep()
    # Nobody claimed it within a lease period: presumed lost, swept.
    Session.objects.filter(id=session.id).update(last_event_at=timezone.now() - timedelta(seconds=31))
    assert str(session.id) in sweep()


def test_sweep_takes_an_expired_lease_at_once_and_skips_a_live_one(session: Session) -> None:
    services.inject(session.id, "hello", wake=True)
    got = lease.claim(session.id)
    assert got is not None
    lease.keeper.drop(got)
    assert str(session.id) not in sweep()
    Session.objects.filter(id=session.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert str(session.id) in sweep()


def test_the_first_sweep_of_a_process_takes_unclaimed_turns_at_once(session: Session, settings: Any) -> None:
    settings.TERRET_LEASE_SECONDS = 30.0
    services.inject(session.id, "hello", wake=True)
    assert str(session.id) not in sweep()
    # A process starting now: an in-process queue holding its wake-up is gone.
    assert str(session.id) in sweep(at_start=True)


def test_the_first_sweep_leaves_a_turn_to_the_wake_up_liveness_just_sent(session: Session, settings: Any) -> None:
    # A fresh worker finds a dead process's session at its key's first poll
    # and wakes it (sessions_app/tasks.py, _wake_gone); its start sweep, a
    # moment later, would send a second drive that finds the turn busy.
    settings.TERRET_LEASE_SECONDS = 0.5
    services.inject(session.id, "hello", wake=True)
    sid = str(session.id)
    note_woken(sid)
    assert sid not in sweep(at_start=True)
    assert sid not in sweep(at_start=True)  # the start sweep records nothing of its own
    time.sleep(0.6)  # a lease period later, a wake-up that was lost is swept again
    assert sid in sweep(at_start=True)


def test_renewal_gives_each_lease_its_own_ttl(session: Session, make_user: Any, profile: Any) -> None:
    other = services.create_session(make_user(), profile)
    short, long = lease.claim(session.id, ttl=1.0), lease.claim(other.id, ttl=60.0)
    assert short is not None and long is not None
    for held in (short, long):
        lease.keeper.drop(held)
    assert lease.renew_many([short, long]) == [short, long]
    now = timezone.now()
    short_until = Session.objects.get(id=session.id).lease_expires_at - now
    long_until = Session.objects.get(id=other.id).lease_expires_at - now
    assert short_until < timedelta(seconds=1.5) < timedelta(seconds=55) < long_until
    lease.release(short)
    lease.release(long)


def test_a_releasing_append_writes_and_gives_the_lease_up_in_one_commit(session: Session) -> None:
    """append_many(release=True): the turn's last batch and the release
    together. The workload it returns is the row as left; a superseded fence
    writes nothing and releases nothing."""
    from dataclasses import astuple

    from sessions_app.log import LeaseLost
    from sessions_app.log.records import WORKLOAD_COLUMNS as HEAD_COLUMNS

    services.run_turn(session.id, "go")
    held = lease.claim(session.id)
    assert held is not None
    # Two events that set the same projection column take the one-by-one path
    # on Postgres too (as SQLite always does); both paths release.
    for batch in (
        [("turn/end", {"status": "completed"})],
        [("session/titled", {"title": "a"}), ("session/titled", {"title": "b"})],
    ):
        events = log.append_many(session.id, batch, fence=held.fence, release=True)
        head = events.workload
        assert [e.kind for e in events] == [k for k, _ in batch]
        assert head is not None
        row = Session.objects.filter(id=session.id).values(*HEAD_COLUMNS, "lease_owner", "lease_expires_at").get()
        *columns, slots_wanted = astuple(head)  # the columns in order, then what the statement also read
        assert dict(zip(HEAD_COLUMNS, columns, strict=True)) == {c: row[c] for c in HEAD_COLUMNS}
        assert slots_wanted is False  # nobody waits for an agent slot
        assert row["open_turn_seq"] is None
        assert row["lease_owner"] == "" and row["lease_expires_at"] is None
        assert lease.released(held, head).open_turn_seq is None
        assert (session.id, held.gen) not in lease.keeper._held
    taken = lease.claim(session.id)
    assert taken is not None and taken.gen == held.gen + 1
    last = Session.objects.get(id=session.id).last_seq
    with pytest.raises(LeaseLost):
        log.append_many(session.id, [("session/titled", {"title": "late"})], fence=held.fence, release=True)
    row = Session.objects.filter(id=session.id).values("last_seq", "lease_owner").get()
    assert row == {"last_seq": last, "lease_owner": taken.owner}
    lease.release(taken)


def test_a_releasing_append_says_whether_any_session_waits_for_an_agent_slot(
    session: Session, profile: AgentProfile, make_user: Any
) -> None:
    """The turn's last commit reads it in the same statement
    (Workload.slots_wanted), so the after-turn hook need not ask; on both
    backends, and on both of PostgreSQL's paths (one statement, or runs in a
    transaction). A plain release does not look: True, offer_slots checks."""
    other = Session.objects.create(owner=make_user(), profile=profile)

    def released(batch: list[tuple[str, dict[str, Any]]]) -> bool:
        services.run_turn(session.id, "go")
        held = claimed(session.id)
        ending = [*batch, ("turn/end", {"status": "completed"})]
        events = log.append_many(session.id, ending, fence=held.fence, release=True)
        assert events.workload is not None and events.workload.open_turn_seq is None
        return events.workload.slots_wanted

    one_statement: list[tuple[str, dict[str, Any]]] = []
    two_runs = [("session/titled", {"title": "a"}), ("session/titled", {"title": "b"})]
    assert released(one_statement) is False and released(two_runs) is False
    log.append(other.id, "agent/waiting", {"reason": "the registry is full", "live": 1})
    assert Session.objects.get(id=other.id).waiting_seq is not None
    assert released(one_statement) is True and released(two_runs) is True
    log.append(other.id, "agent/spawned", {"agent_id": "x", "profile": profile.name, "live": 1})
    assert Session.objects.get(id=other.id).waiting_seq is None
    assert released(one_statement) is False
    held = claimed(session.id)
    plain = lease.release(held)
    assert plain is not None and plain.slots_wanted is True


def test_a_turn_ends_with_its_lease_released_by_the_last_commit(session: Session, fake_llm: Any) -> None:
    from sessions_app.runtime.runner import TurnRunner
    from tests.fakes.fake_llm import Reply

    fake_llm.script(Reply(text="done"))
    services.run_turn(session.id, "go")
    held = lease.claim(session.id)
    assert held is not None and held.workload.open_turn_seq is not None and held.driving.profile is not None
    runner = TurnRunner(session.id, held.driving.profile, held)
    assert runner.run(held.workload.open_turn_seq) == "ended"
    assert runner.outbox.released is not None and runner.outbox.released.open_turn_seq is None
    row = Session.objects.filter(id=session.id).values("lease_owner", "lease_expires_at", "lease_gen").get()
    assert row == {"lease_owner": "", "lease_expires_at": None, "lease_gen": held.gen}


@pytest.mark.postgres
def test_the_claim_reads_the_open_turn_with_it(session: Session) -> None:
    """On Postgres the claim's statement also returns the open turn's view,
    so the runner's load costs no round trip; it is what turn_view reads."""
    from sessions_app.log.reads import turn_view

    services.run_turn(session.id, "go")
    held = lease.claim(session.id)
    assert held is not None and held.workload.open_turn_seq is not None
    try:
        expected = turn_view(session.id, 0, held.workload.open_turn_seq)
        assert held.view == expected
        assert [kind for _, kind, _ in expected][-2:] == ["turn/start", "user/message"]
        assert held.take_view(held.workload.open_turn_seq + 1) is None  # another turn's: not used
        assert held.view is None  # taken once
    finally:
        lease.release(held)
    idle = lease.claim(session.id)
    assert idle is not None
    lease.release(idle)


@pytest.mark.postgres
def test_a_claim_that_waited_on_the_row_lock_drops_its_stale_view(session: Session, fake_llm: Any) -> None:
    """A claim blocked on the row lock by an appender sees that append's row
    version but, in its subquery, the snapshot from before it: the view
    would miss the event. It is dropped, and the runner reads the turn, so
    the cancel committed meanwhile is honoured with no model call."""
    from sessions_app.runtime.runner import TurnRunner

    services.run_turn(session.id, "go")
    locked, blocked = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def claimer() -> None:
        locked.wait(5)
        blocked.set()
        result["lease"] = lease.claim(session.id)

    worker = threading.Thread(target=claimer)
    worker.start()
    with log.locked(session.id) as tx:
        tx.append("turn/cancel_requested", {"by": "test"})
        locked.set()
        blocked.wait(5)
        _wait_for_lock_waiter()
    worker.join(10)
    held = result["lease"]
    assert held is not None and held.view is None and held.driving.profile is not None
    runner = TurnRunner(session.id, held.driving.profile, held)
    assert held.workload.open_turn_seq is not None
    assert runner.run(held.workload.open_turn_seq) == "ended"
    assert fake_llm.requests == []
    assert list(Event.objects.filter(session=session, kind="turn/end").values_list("data", flat=True)) == [
        {"status": "cancelled"}
    ]


def _wait_for_lock_waiter(timeout: float = 5.0) -> None:
    """Until some backend waits on a row lock (the claim behind ours)."""
    import time

    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    deadline = time.monotonic() + timeout
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
            if waiting and waiting[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the claim never waited on the row lock")
