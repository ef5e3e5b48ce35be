"""Schedules that cannot poison the clock, and a fair clock (issue 27).

A time outside the range is refused by the one check every door shares
(services/schedules.check_time); a row that holds an impossible time anyway
(written here by SQL: PostgreSQL stores it, psycopg cannot read it back) is
read through a clamp, marked failed once by the clock, and no read of it
answers 500; and one owner's storm of due schedules takes at most its share
of a clock round, so another owner's one-shot is fired in the first round.
Firings are counted in the log."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError, connection
from django.urls import reverse
from django.utils import timezone

from sessions_app import services
from sessions_app.errors import TimeOutOfRange
from sessions_app.models import AgentProfile, Event, Schedule, Session
from sessions_app.runtime.schedules import _round, tick
from sessions_app.services import operators, schedules
from sessions_app.services.sessions import archive_session
from sessions_app.tools import builtins
from sessions_app.tools.base import ToolError
from tests.helpers import client_for, events, wait_for
from tests.sessions_app.apiutil import bearer, token_for

pytestmark = pytest.mark.django_db(transaction=True)

# Year 1 at +14:00 is year 0 in UTC; 9999-12-31 at -14:00 is year 10000.
TOO_EARLY = "0001-01-01T00:00:00+14:00"
TOO_LATE = "9999-12-31T23:00:00-14:00"
FAST = {"TERRET_SCHEDULE_POLL_SECONDS": "0.05"}


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="sched",
        roles={"main": "test/model"},
        builtin_tools=["debug.noop", "schedule.create", "schedule.list", "schedule.cancel"],
        min_schedule_seconds=1,
        max_schedules=50,
        allow_floor=["*"],
    )


def at(seconds: float) -> str:
    return (timezone.now() + timedelta(seconds=seconds)).isoformat()


def make(session: Session, **body: Any) -> Schedule:
    body.setdefault("text", "wake up")
    return schedules.create(session.id, body, by="owner")[0]


def poison(s: Schedule, when: str) -> None:
    """Write an impossible due time the way a bad migration or a hand would."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Schedule._meta.db_table} SET due_at = %s::timestamptz WHERE id = %s", [when, s.id])


def raw_read_fails(s: Schedule) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT due_at FROM {Schedule._meta.db_table} WHERE id = %s", [s.id])
        try:
            cursor.fetchone()
        except DataError:
            return True
    return False


# ---------------------------------------------------------------- input


@pytest.mark.usefixtures("manual_worker")
def test_times_out_of_range_are_refused_and_past_times_kept(session: Session, settings: Any) -> None:
    before = Event.objects.filter(session=session).count()
    far = (timezone.now() + timedelta(days=3654)).isoformat()
    long_ago = (timezone.now() - timedelta(days=3654)).isoformat()
    for body in (
        {"due_at": TOO_EARLY},
        {"due_at": TOO_LATE},
        {"due_at": "9999-12-31T23:59:59+00:00"},
        {"due_at": far},
        {"due_at": long_ago},
        {"every_seconds": 20 * 365 * 86400},  # a first due time 20 years out
    ):
        with pytest.raises(TimeOutOfRange):
            make(session, **body)
    assert Schedule.objects.count() == 0 and Event.objects.filter(session=session).count() == before
    # A due time an hour ago is accepted: its misfire policy decides (here: skip).
    past = make(session, due_at=at(-3600), misfire="skip")
    assert tick() == 1
    past.refresh_from_db()
    assert (past.status, past.runs) == ("skipped", 0) and "misfire" in past.status_reason
    # The bound is a setting.
    settings.TERRET_SCHEDULE_HORIZON_DAYS = 1
    with pytest.raises(TimeOutOfRange, match="within 1 days"):
        make(session, due_at=at(2 * 86400))


@pytest.mark.usefixtures("manual_worker")
def test_the_agents_tool_refuses_a_time_out_of_range(session: Session) -> None:
    create = builtins.BUILTINS["schedule.create"].handler
    for when in (TOO_EARLY, TOO_LATE):
        with pytest.raises(ToolError, match="due_at"):
            create(builtins.context_for(session.id, f"call-{when}"), {"text": "t", "due_at": when})
    made = json.loads(create(builtins.context_for(session.id, "call-ok"), {"text": "t", "due_at": at(60)}))
    assert made["status"] == "pending" and Schedule.objects.count() == 1


# ---------------------------------------------------------------- a row unreadable anyway


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
def test_the_clock_marks_an_unreadable_row_failed_once_and_fires_the_others(owner: Any, profile: AgentProfile) -> None:
    sessions = [services.create_session(owner, profile) for _ in range(4)]
    low, high = make(sessions[0], due_at=at(-1)), make(sessions[1], due_at=at(3600))
    good = [make(s, due_at=at(-0.5)) for s in sessions[2:]]
    poison(low, TOO_EARLY)
    poison(high, TOO_LATE)
    assert raw_read_fails(low) and raw_read_fails(high), "the premise: the driver cannot read either row"
    assert tick() == 4
    for bad in (low, high):
        bad.refresh_from_db()
        assert (bad.status, bad.due_at) == ("failed", None)
        assert "outside the years 1..9999" in bad.status_reason
        assert bad.generation == 1, "claimed and marked once"
    for s in good:
        s.refresh_from_db()
        assert (s.status, s.runs) == ("completed", 1)
    assert Event.objects.filter(kind="schedule/fired").count() == 2
    assert tick() == 0, "nothing left: the bad rows are not claimed again"
    assert Schedule.objects.get(id=low.id).generation == 1


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
def test_a_row_that_fails_to_fire_is_marked_failed_and_the_clock_goes_on(owner: Any, profile: AgentProfile) -> None:
    """Any failure but a database outage: the row ends failed with the error
    named, its firing rolled back, and the next row of the round fires."""
    a, b = (services.create_session(owner, profile) for _ in range(2))
    broken, fine = make(a, due_at=at(-1), every_seconds=60), make(b, due_at=at(-0.5))
    Schedule.objects.filter(id=broken.id).update(cron="not a cron")  # both set: next_after trips on the cron
    assert tick() == 2
    broken.refresh_from_db()
    assert broken.status == "failed" and "could not fire it" in broken.status_reason
    assert events(a, "schedule/fired") == [], "its firing was rolled back with it"
    assert len(events(b, "schedule/fired")) == 1
    fine.refresh_from_db()
    assert (fine.status, fine.runs) == ("completed", 1)
    assert tick() == 0


@pytest.mark.postgres
@pytest.mark.worker
def test_a_worker_fires_on_time_past_an_unreadable_row(
    fake_llm: Any, start_worker: Any, owner: Any, profile: AgentProfile
) -> None:
    bad_session, good_session = (services.create_session(owner, profile) for _ in range(2))
    bad = make(bad_session, due_at=at(-1))
    poison(bad, TOO_EARLY)
    start_worker(name="clock", **FAST)
    make(good_session, due_at=at(1.0))
    wait_for(lambda: events(good_session, "turn/end"), timeout=30, what="the good schedule's turn")
    (f,) = events(good_session, "schedule/fired")
    assert f["late_ms"] < 1000, "on time: the bad row held nothing up"
    bad.refresh_from_db()
    assert bad.status == "failed" and len(fake_llm.requests) == 1
    time.sleep(0.3)  # further ticks leave it as it is
    assert Schedule.objects.get(id=bad.id).generation == bad.generation


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
def test_no_read_of_an_unreadable_row_answers_500(make_user: Any, owner: Any, profile: AgentProfile) -> None:
    """No clock runs here: the pages, the API, the admin and the operators'
    actions meet the rows as they are."""
    chat, archived, revoked = (services.create_session(owner, profile) for _ in range(3))
    rows = {}
    for s, when in ((chat, TOO_EARLY), (archived, TOO_LATE), (revoked, TOO_EARLY)):
        rows[s.id] = make(s, due_at=at(600))
        poison(rows[s.id], when)
    extra = make(chat, due_at=at(600))
    poison(extra, TOO_LATE)
    staff = client_for(make_user("root", is_staff=True, is_superuser=True))
    mine = client_for(owner)
    auth: Any = bearer(token_for(owner))
    api = f"/api/sessions/{chat.id}/schedules"
    for client, path in (
        (mine, reverse("sessions:chat", args=[chat.id])),
        (staff, reverse("sessions:console")),
        (staff, reverse("admin:sessions_app_schedule_changelist")),
        (staff, reverse("admin:sessions_app_schedule_change", args=[extra.id])),
    ):
        r = client.get(path)
        assert r.status_code == 200, path
    listed = client_for(owner).get(api, **auth).json()["schedules"]
    assert {x["due_at"][:4] for x in listed} == {"0001", "9999"}, "shown clamped to the bounds"
    gone = client_for(owner).delete(f"{api}/{rows[chat.id].id}", **auth)
    assert (gone.status_code, gone.json()["status"]) == (200, "cancelled")
    archive_session(archived.id, by="owner")
    operators.revoke(revoked.id, by="ops", reason="look")
    for sid in (chat.id, archived.id, revoked.id):
        row = Schedule.objects.get(id=rows[sid].id)
        assert (row.status, row.due_at) == ("cancelled", None)
    assert not raw_read_fails(rows[chat.id])


# ---------------------------------------------------------------- a fair clock


@pytest.mark.usefixtures("manual_worker")
def test_a_noisy_owners_storm_does_not_delay_another_owners_one_shot(
    make_user: Any, profile: AgentProfile, settings: Any
) -> None:
    """300 of one owner's schedules due over the last 50 s, in 10 sessions;
    another owner's one-shot due after all of them. The first round fires
    the quiet owner's, and at most the noisy owner's share."""
    settings.TERRET_SCHEDULE_PER_SESSION, settings.TERRET_SCHEDULE_PER_OWNER = 5, 20
    settings.TERRET_SCHEDULE_POLL_SECONDS = 600  # no round cut short by time: its rows are counted
    noisy, quiet = make_user("noisy"), make_user("quiet")
    storm = [services.create_session(noisy, profile) for _ in range(10)]
    now = timezone.now()
    Schedule.objects.bulk_create(
        Schedule(session_id=storm[i % 10].id, text=f"storm {i}", due_at=now - timedelta(seconds=50 - i * 0.1))
        for i in range(300)
    )
    calm = services.create_session(quiet, profile)
    one_shot = make(calm, due_at=at(-0.01))
    first = _round(timezone.now())
    assert first[0] == one_shot.id, "every owner's earliest leads the round, the fewest due first"
    assert len(first) == 21
    assert tick(rounds=1) == 21
    assert len(events(calm, "schedule/fired")) == 1, "fired in the first round"
    per_session = [Event.objects.filter(session=s, kind="schedule/fired").count() for s in storm]
    assert sum(per_session) == 20 and max(per_session) <= 5
    assert tick() == 280, "the storm's rest fires in the rounds after"
    assert Event.objects.filter(kind="schedule/fired").count() == 301
