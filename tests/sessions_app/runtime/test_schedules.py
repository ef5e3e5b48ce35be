"""Scheduled wake-ups: the clock's claim and firing, recurrence, misfire
policies, coalescing, pausing after no progress, and the rechecks before
each firing (budgets, suspension, revocation). The clock's logic is driven
with `tick(now=...)` in-process; the guarantees that need processes (one
firing however many workers claim, misfires across real downtime, the
agent's own tool under approval) run against real Celery workers. Model
requests are counted at the fake server."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals_app import services as approvals
from sessions_app import log, services
from sessions_app.errors import IdempotencyConflict, InvalidInput, ScheduleLimit
from sessions_app.models import AgentProfile, Event, Schedule, Session
from sessions_app.runtime.drive import drive
from sessions_app.runtime.schedules import start_clock, stop_clock, tick
from sessions_app.services import inputs, operators, schedules
from sessions_app.services.budgets import set_budget
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NO_LIMIT = {"cost_usd": None, "tokens": None, "steps": None, "turns": None}


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="sched",
        roles={"main": "test/model"},
        builtin_tools=["debug.noop", "schedule.create", "schedule.list", "schedule.cancel"],
        min_schedule_seconds=1,
        max_schedules=5,
        schedule_pause_after=2,
        allow_floor=["*"],
    )


def make(session: Session, **body: Any) -> Schedule:
    body.setdefault("text", "wake up")
    s, _ = schedules.create(session.id, body, by="owner")
    return s


def fired(session: Session) -> list[dict[str, Any]]:
    return events(session, "schedule/fired")


def at(seconds: float) -> str:
    return (timezone.now() + timedelta(seconds=seconds)).isoformat()


# ---------------------------------------------------------------- in-process


@pytest.mark.usefixtures("manual_worker")
def test_a_one_shot_schedule_fires_once_as_a_follow_up(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="checked"))
    s = make(session, due_at=at(-0.5), reason="check the deploy")
    assert events(session, "schedule/created")[0]["reason"] == "check the deploy"
    assert tick() == 1
    assert tick() == 0, "a second tick finds nothing due"
    s.refresh_from_db()
    assert (s.status, s.runs, s.due_at) == ("completed", 1, None)
    assert s.last_outcome is not None and s.last_outcome["outcome"] == "ran"
    (f,) = fired(session)
    deferred = Event.objects.get(session=session, seq=f["input_seq"])
    assert deferred.kind == "input/deferred" and deferred.data["schedule_id"] == str(s.id)
    assert drive(session.id) == "ended"
    assert len(fake_llm.requests) == 1
    assert "wake up" in str(fake_llm.requests[0]["messages"])
    assert inputs.receipt(session.id, f["input_seq"]).disposition == "answered"


@pytest.mark.usefixtures("manual_worker")
def test_an_interval_keeps_its_phase_and_stops_at_max_runs(session: Session) -> None:
    t0 = timezone.now()
    s = make(session, due_at=t0.isoformat(), every_seconds=60, max_runs=3)
    for k in range(3):
        tick(now=t0 + timedelta(seconds=60 * k + 1))
        s.refresh_from_db()
        # Each firing's turn ends before the next due time, so none coalesces.
        for e in Event.objects.filter(session=session, kind="input/deferred"):
            if not Event.objects.filter(session=session, kind="user/message", data__source_seq=e.seq).exists():
                with log.locked(session.id) as tx:
                    tx.append("turn/start", {})
                    tx.append("user/message", {"text": "x", "source_seq": e.seq, "lane": "follow_up"})
                    tx.append("turn/end", {"status": "completed"})
        if k < 2:
            assert s.due_at == t0 + timedelta(seconds=60 * (k + 1))
    assert (s.status, s.runs) == ("completed", 3)
    assert len(fired(session)) == 3


@pytest.mark.usefixtures("manual_worker")
def test_cron_recurrence_uses_the_expression(session: Session) -> None:
    s = make(session, cron="*/5 * * * *")
    assert s.due_at is not None and s.due_at.minute % 5 == 0 and s.due_at.second == 0
    due = s.due_at
    tick(now=due + timedelta(seconds=1))
    s.refresh_from_db()
    assert s.due_at == due + timedelta(minutes=5)


@pytest.mark.usefixtures("manual_worker")
@pytest.mark.parametrize("policy", ["skip", "run_once", "reschedule"])
def test_misfire_policies_after_downtime(session: Session, policy: str) -> None:
    """Due at t0, every 60 s; nothing ran until t0 + 190 s (due times at
    t0, +60, +120, +180 passed; the grace is 60 s)."""
    t0 = timezone.now() - timedelta(seconds=190)
    s = make(session, due_at=t0.isoformat(), every_seconds=60, misfire=policy)
    now = t0 + timedelta(seconds=190)
    tick(now=now)
    s.refresh_from_db()
    assert s.last_outcome is not None
    if policy == "skip":
        assert fired(session) == []
        assert s.last_outcome["outcome"] == "skipped" and "misfire" in s.last_outcome["reason"]
        assert s.due_at == t0 + timedelta(seconds=240)
        assert s.runs == 0
    else:
        (f,) = fired(session)
        assert f["missed"] == 3
        assert s.last_outcome["outcome"] == "late" and s.last_outcome["late_seconds"] == pytest.approx(190, abs=1)
        expected = t0 + timedelta(seconds=240) if policy == "run_once" else now + timedelta(seconds=60)
        assert s.due_at == expected
        assert s.runs == 1


@pytest.mark.usefixtures("manual_worker")
def test_duplicate_firings_coalesce_while_the_input_waits(session: Session) -> None:
    t0 = timezone.now()
    s = make(session, due_at=t0.isoformat(), every_seconds=10)
    services.run_turn(session.id, "a long turn")  # busy: the follow-up waits
    tick(now=t0 + timedelta(seconds=1))
    tick(now=t0 + timedelta(seconds=11))
    s.refresh_from_db()
    assert len(fired(session)) == 1
    assert s.last_outcome is not None and "coalesced" in s.last_outcome["reason"]
    assert Session.objects.get(id=session.id).queued_follow_ups == 1


@pytest.mark.usefixtures("manual_worker")
def test_it_pauses_itself_after_runs_without_progress(fake_llm: Any, session: Session) -> None:
    """The profile pauses a schedule after 2 consecutive runs whose turns
    failed; the pause is logged with its reason."""
    t0 = timezone.now()
    s = make(session, due_at=t0.isoformat(), every_seconds=10)
    fake_llm.script(*[Reply(status=400, error_message="bad request") for _ in range(5)])
    for k in range(3):
        tick(now=t0 + timedelta(seconds=10 * k + 1))
        drive(session.id)
    s.refresh_from_db()
    assert [e["status"] for e in events(session, "turn/end")] == ["failed", "failed"]
    assert s.status == "paused" and "without progress" in s.status_reason
    (paused,) = events(session, "schedule/paused")
    assert paused["schedule_id"] == str(s.id)
    assert len(fake_llm.requests) == 2, "the third due time started nothing"
    schedules.resume(session.id, s.id, by="owner")
    s.refresh_from_db()
    assert s.status == "pending" and s.no_progress == 0


@pytest.mark.usefixtures("manual_worker")
def test_rechecks_before_firing(session: Session) -> None:
    t0 = timezone.now()
    s = make(session, due_at=t0.isoformat(), every_seconds=10)
    # An exhausted budget: skipped, with the budget named.
    services.run_turn(session.id, "one")
    with log.locked(session.id) as tx:
        tx.append("turn/end", {"status": "completed"})
    set_budget(session.id, {**NO_LIMIT, "turns": 1}, by="owner")
    tick(now=t0 + timedelta(seconds=1))
    s.refresh_from_db()
    assert fired(session) == [] and s.last_outcome is not None
    assert s.last_outcome["outcome"] == "skipped" and s.last_outcome["reason"].startswith("budget:")
    # A suspension: skipped, held.
    set_budget(session.id, NO_LIMIT, by="owner")
    operators.suspend("session", str(session.id), by="ops", reason="look")
    tick(now=t0 + timedelta(seconds=11))
    s.refresh_from_db()
    assert fired(session) == [] and s.last_outcome["reason"].startswith("held:")
    operators.resume("session", str(session.id), by="ops")
    tick(now=t0 + timedelta(seconds=21))
    assert len(fired(session)) == 1
    # Revoked: cancelled, and logged.
    operators.revoke(session.id, by="ops", reason="compromised")
    s.refresh_from_db()
    assert s.status == "cancelled" and "revoked" in s.status_reason
    assert events(session, "schedule/cancelled")[-1]["schedule_id"] == str(s.id)


@pytest.mark.usefixtures("manual_worker")
def test_a_schedule_budget_ends_it(fake_llm: Any, session: Session) -> None:
    t0 = timezone.now()
    s = make(session, due_at=t0.isoformat(), every_seconds=10, budget_tokens=10)
    fake_llm.script(Reply(text="a", usage=(10, 5, None)))
    tick(now=t0 + timedelta(seconds=1))
    drive(session.id)
    tick(now=t0 + timedelta(seconds=11))
    s.refresh_from_db()
    assert (s.status, s.spent_tokens) == ("failed", 15)
    assert "budget" in s.status_reason and len(fired(session)) == 1


@pytest.mark.usefixtures("manual_worker")
def test_creation_is_validated_against_the_profile(session: Session) -> None:
    before = Event.objects.filter(session=session).count()
    make(session, every_seconds=1)  # allowed: 1 s is the profile's shortest
    AgentProfile.objects.filter(id=session.profile_id).update(min_schedule_seconds=60)
    with pytest.raises(ScheduleLimit, match="at least 60"):
        make(session, every_seconds=30)
    for bad in (
        {"text": "t"},
        {"due_at": "tomorrow"},
        {"due_at": "2030-01-01T09:00:00"},  # no time zone
        {"cron": "every day"},
        {"every_seconds": 60, "cron": "* * * * *"},
        {"due_at": at(60), "misfire": "sometimes"},
        {"text": "", "due_at": at(60)},
    ):
        with pytest.raises(InvalidInput):
            schedules.create(session.id, bad if "text" in bad else {"text": "t", **bad}, by="owner")
    AgentProfile.objects.filter(id=session.profile_id).update(min_schedule_seconds=120)
    with pytest.raises(ScheduleLimit, match="shortest is 120"):
        make(session, cron="* * * * *")  # every 60 s
    AgentProfile.objects.filter(id=session.profile_id).update(min_schedule_seconds=1, max_schedules=1)
    with pytest.raises(ScheduleLimit, match="most"):
        make(session, due_at=at(60))
    # One schedule (the first) and its one event: every refusal wrote nothing.
    assert Schedule.objects.filter(session=session).count() == 1
    assert Event.objects.filter(session=session).count() == before + 1


@pytest.mark.usefixtures("manual_worker")
def test_an_idempotency_key_answers_the_same_schedule(session: Session) -> None:
    body = {"text": "t", "due_at": at(60), "idempotency_key": "daily-check"}
    a, new_a = schedules.create(session.id, body, by="owner")
    b, new_b = schedules.create(session.id, body, by="owner")
    assert (new_a, new_b, a.id) == (True, False, b.id)
    with pytest.raises(IdempotencyConflict):
        schedules.create(session.id, {**body, "text": "other"}, by="owner")
    assert Schedule.objects.filter(session=session).count() == 1


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
def test_concurrent_ticks_fire_each_schedule_once(owner: Any, profile: AgentProfile) -> None:
    sessions = [services.create_session(owner, profile) for _ in range(20)]
    for s in sessions:
        make(s, due_at=at(-0.1))
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        tick()
        connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in sessions:
        assert len(fired(s)) == 1
    assert Schedule.objects.filter(status="completed").count() == 20


@pytest.mark.embedded
def test_the_embedded_clock_fires_in_process(fake_llm: Any, session: Session, settings: Any, tmp_path: Any) -> None:
    """SQLite and the in-process worker: the process's own clock fires the
    schedule and the in-process worker runs its turn."""
    settings.TERRET_WORKER = "inprocess"
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    settings.TERRET_SCHEDULE_POLL_SECONDS = 0.05
    fake_llm.script(Reply(text="on time"))
    # A clock an earlier test started (importing terret_site.asgi in embedded
    # mode starts one) may still run on that test's database: this one's own.
    stop_clock()
    start_clock(lambda: settings.TERRET_WORKER == "inprocess")
    try:
        make(session, due_at=at(0.3))
        wait_for(lambda: events(session, "turn/end"), timeout=20, what="the scheduled turn")
        assert len(fired(session)) == 1 and len(fake_llm.requests) == 1
    finally:
        stop_clock()


# ---------------------------------------------------------------- real workers

FAST = {"TERRET_SCHEDULE_POLL_SECONDS": "0.05", "TERRET_SCHEDULE_GRACE_SECONDS": "1"}


@pytest.mark.worker
def test_three_workers_and_duplicate_sweeps_fire_a_one_shot_once(
    fake_llm: Any, start_worker: Any, owner: Any, profile: AgentProfile
) -> None:
    sessions = [services.create_session(owner, profile) for _ in range(15)]
    for w in range(3):
        start_worker(name=f"s{w}", **FAST)
    for s in sessions:
        make(s, due_at=at(1.0))
    # The test process ticks too, as a fourth claimer.
    stop = time.monotonic() + 4
    while time.monotonic() < stop:
        tick()
        time.sleep(0.02)
    wait_for(lambda: Event.objects.filter(kind="turn/end").count() >= 15, timeout=60, what="15 turns")
    time.sleep(1.0)  # a duplicate would have fired by now
    for s in sessions:
        assert len(fired(s)) == 1
        assert len(events(s, "turn/end")) == 1
    assert len(fake_llm.requests) == 15


@pytest.mark.worker
@pytest.mark.parametrize("policy", ["skip", "run_once", "reschedule"])
def test_misfires_with_the_workers_down_across_three_due_times(
    fake_llm: Any, start_worker: Any, session: Session, policy: str
) -> None:
    """Every 3 s from t0; no worker runs until three due times have passed."""
    t0 = timezone.now() + timedelta(seconds=0.5)
    s = make(session, due_at=t0.isoformat(), every_seconds=3, misfire=policy)
    time.sleep(max(0.0, (t0 + timedelta(seconds=7) - timezone.now()).total_seconds()))  # t0, +3, +6 passed
    start_worker(name="late", **FAST)
    s = wait_for(
        lambda: (
            Schedule.objects.filter(id=s.id, skipped__gte=1).first()
            or Schedule.objects.filter(id=s.id, runs__gte=1).first()
        ),
        timeout=30,
        what="the first handling",
    )
    first = s.last_outcome
    assert first is not None
    if policy == "skip":
        # One skip for t0, +3 and +6; the next due time fires normally, once.
        # A loaded machine may ready the worker so late that this first looks
        # after that run too (its outcome then replaced the skip's): what
        # is certain is in the counts and in the log, not in last_outcome.
        if first["outcome"] == "skipped":
            assert "misfire" in first["reason"] and fired(session) == []
        (f, *_) = wait_for(lambda: fired(session), timeout=10, what="the next due time")
        assert Schedule.objects.get(id=s.id).skipped == 1
        offset = (timezone.datetime.fromisoformat(f["due_at"]) - t0).total_seconds()
        assert offset > 8.99 and min(offset % 3, 3 - offset % 3) < 0.01, "a due time after the skip, in phase"
        assert "missed" not in f, "the missed due times were skipped, not folded into this run"
    else:
        # One late run for t0, +3 and +6, in the log whatever ran after it.
        (f, *later) = fired(session)
        due = timezone.datetime.fromisoformat(f["due_at"])
        assert due == t0 and f["missed"] >= 2 and f["late_ms"] > 1000
        assert all(timezone.datetime.fromisoformat(e["due_at"]) - t0 > timedelta(seconds=8) for e in later)
        s = Schedule.objects.get(id=s.id)
        phase = (s.due_at - t0).total_seconds() % 3
        if policy == "run_once":
            assert min(phase, 3 - phase) < 0.01, "run_once keeps the recurrence's phase"
        else:
            fired_at = due + timedelta(milliseconds=f["late_ms"])  # the late firing's clock, to the millisecond
            since = (s.due_at - fired_at).total_seconds() % 3
            assert min(since, 3 - since) < 0.01, "reschedule restarts it from the firing"
        wait_for(lambda: len(events(session, "turn/end")) >= 1, timeout=20, what="the late run's turn")
        assert 1 <= len(fake_llm.requests) <= len(fired(session)), "one turn for all the missed due times"


@pytest.mark.worker
def test_the_agent_schedules_itself_through_its_tool_under_approval(
    fake_llm: Any, start_worker: Any, session: Session, make_reviewer: Any
) -> None:
    """schedule.create is mutating: the approval policy asks; once approved
    the tool makes the schedule, which then fires a turn of its own."""
    fake_llm.script(
        Reply(tool_calls=[("schedule.create", {"text": "follow up on the deploy", "due_at": at(3)})]),
        Reply(text="scheduled"),
        Reply(text="followed up"),
    )
    start_worker(name="agent", **FAST)
    services.run_turn(session.id, "remind yourself in a few seconds")
    request = wait_for(lambda: events(session, "approval/requested"), timeout=30, what="the approval request")[0]
    assert Schedule.objects.count() == 0, "nothing before the verdict"
    approvals.decide(session.id, request["call_id"], "approve", user=make_reviewer("rev"))
    wait_for(lambda: Schedule.objects.filter(session=session).exists(), timeout=30, what="the schedule")
    s = Schedule.objects.get(session=session)
    assert s.created_by == "agent" and s.idempotency_key
    wait_for(lambda: len(events(session, "turn/end")) >= 2, timeout=30, what="the scheduled turn")
    assert len(fired(session)) == 1
    assert "follow up on the deploy" in str(fake_llm.requests[2]["messages"])
    assert len(fake_llm.requests) == 3
