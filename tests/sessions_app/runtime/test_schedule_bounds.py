"""Bounded by default (issue 31, point 3): a recurring schedule stops after
max_runs or at expires_at, its profile's when the request names none, from
every door; a new profile gets a daily cost and token budget; a schedule
whose owner's account is inactive is cancelled (`owner_inactive`) at its
next due time; and the migration sets all of it on the rows that exist."""

from __future__ import annotations

import importlib
import json
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.forms.models import model_to_dict
from django.utils import timezone

from sessions_app import log
from sessions_app.admin import AgentProfileForm
from sessions_app.errors import InvalidInput, TimeOutOfRange
from sessions_app.models import AgentProfile, Schedule, Session
from sessions_app.runtime.schedules import tick
from sessions_app.services import schedules
from sessions_app.tools.base import ToolContext
from sessions_app.tools.schedules import DEFINITIONS
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for
from tests.sessions_app.apiutil import bearer, call, token_for

pytestmark = pytest.mark.django_db(transaction=True)

existing_rows = importlib.import_module("sessions_app.migrations.0027_hbounds_existing_rows")


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="bounded",
        roles={"main": "test/model"},
        builtin_tools=["debug.noop", "schedule.create"],
        min_schedule_seconds=1,
        allow_floor=["*"],
        schedule_max_runs=5,
        schedule_expires_days=2,
    )


def make(session: Session, **body: Any) -> Schedule:
    body.setdefault("text", "wake up")
    s, _ = schedules.create(session.id, body, by="owner")
    return s


def cancelled(session: Session) -> list[dict[str, Any]]:
    return events(session, "schedule/cancelled")


def close_enough(a: Any, b: Any, seconds: float = 5.0) -> bool:
    return abs((a - b).total_seconds()) < seconds


# ---------------------------------------------------------------- the defaults


def test_the_shipped_defaults_are_generous_and_documented() -> None:
    assert django_settings.TERRET_SCHEDULE_MAX_RUNS == 1000
    assert django_settings.TERRET_SCHEDULE_EXPIRES_DAYS == 90
    assert django_settings.TERRET_PROFILE_DAILY_COST_USD == Decimal(50)
    assert django_settings.TERRET_PROFILE_DAILY_TOKENS == 20_000_000


def test_a_new_profile_takes_its_bounds_from_the_settings(settings: Any) -> None:
    settings.TERRET_SCHEDULE_MAX_RUNS = 7
    settings.TERRET_SCHEDULE_EXPIRES_DAYS = 3
    settings.TERRET_PROFILE_DAILY_COST_USD = Decimal("2.5")
    settings.TERRET_PROFILE_DAILY_TOKENS = 1234
    p = AgentProfile.objects.create(name="fresh")
    p.refresh_from_db()
    assert (p.schedule_max_runs, p.schedule_expires_days, p.daily_cost_usd, p.daily_tokens) == (
        7,
        3,
        Decimal("2.5"),
        1234,
    )
    # Empty settings: a new profile has none of them; one set explicitly is kept.
    settings.TERRET_SCHEDULE_MAX_RUNS = settings.TERRET_SCHEDULE_EXPIRES_DAYS = None
    settings.TERRET_PROFILE_DAILY_COST_USD = settings.TERRET_PROFILE_DAILY_TOKENS = None
    bare = AgentProfile.objects.create(name="bare", daily_tokens=99)
    bare.refresh_from_db()
    assert (bare.schedule_max_runs, bare.schedule_expires_days, bare.daily_cost_usd, bare.daily_tokens) == (
        None,
        None,
        None,
        99,
    )


def test_the_admin_edits_a_profiles_bounds_and_refuses_zero(profile: AgentProfile) -> None:
    data = {k: v for k, v in model_to_dict(profile).items() if v is not None}
    for field in (
        "roles",
        "mcp_servers",
        "command_allow",
        "approvals",
        "context_windows",
        "image_roles",
        "allow_floor",
    ):
        if field in data:
            data[field] = json.dumps(data[field])
    zero = AgentProfileForm({**data, "schedule_max_runs": "0", "schedule_expires_days": "0"}, instance=profile)
    assert not zero.is_valid()
    assert {"schedule_max_runs", "schedule_expires_days"} <= set(zero.errors)
    blank = AgentProfileForm({**data, "schedule_max_runs": "", "schedule_expires_days": "30"}, instance=profile)
    assert blank.is_valid(), blank.errors
    saved = blank.save()
    assert (saved.schedule_max_runs, saved.schedule_expires_days) == (None, 30)


@pytest.mark.usefixtures("manual_worker")
def test_a_recurring_schedule_gets_the_profiles_bounds(session: Session, client: Any) -> None:
    now = timezone.now()
    person = make(session, every_seconds=60)
    assert person.max_runs == 5
    assert person.expires_at is not None and close_enough(person.expires_at, now + timedelta(days=2))
    created = events(session, "schedule/created")[-1]
    assert created["max_runs"] == 5 and created["expires_at"] == person.expires_at.isoformat()

    # Over the API, and a cron expression alike; the answer shows the bounds.
    auth = bearer(token_for(session.owner))
    answer = call(client, "POST", f"/api/sessions/{session.id}/schedules", {"text": "t", "cron": "*/5 * * * *"}, **auth)
    assert answer.status_code == 201, answer.data
    assert answer.data["max_runs"] == 5 and answer.data["expires_at"] is not None

    # A request's own bounds are kept; a one-shot gets none (it runs once).
    own = make(session, every_seconds=60, max_runs=2, expires_at=(now + timedelta(hours=1)).isoformat())
    assert own.max_runs == 2 and close_enough(own.expires_at, now + timedelta(hours=1))
    once = make(session, due_at=(now + timedelta(minutes=5)).isoformat())
    assert (once.max_runs, once.expires_at) == (None, None)


@pytest.mark.usefixtures("manual_worker")
def test_the_agents_schedule_tool_is_bounded_too(session: Session, tmp_path: Any) -> None:
    schedules.register_agent_tools()
    create = next(d for d in DEFINITIONS if d.name == "schedule.create")
    ctx = ToolContext(session.id, "call_1", tmp_path, idempotency_key="k1", attempt=1)
    out = json.loads(create.handler(ctx, {"text": "again", "every_seconds": 60}))
    assert out["max_runs"] == 5 and out["expires_at"] is not None
    (created,) = events(session, "schedule/created")
    assert created["by"] == "agent" and created["max_runs"] == 5


@pytest.mark.usefixtures("manual_worker")
def test_a_profile_without_bounds_makes_unbounded_schedules(session: Session, profile: AgentProfile) -> None:
    AgentProfile.objects.filter(id=profile.id).update(schedule_max_runs=None, schedule_expires_days=None)
    s = make(session, every_seconds=60)
    assert (s.max_runs, s.expires_at) == (None, None)


@pytest.mark.usefixtures("manual_worker")
@pytest.mark.parametrize(
    ("expires_at", "error"),
    [
        ("yesterday", InvalidInput),
        ("2026-01-01T00:00:00", InvalidInput),  # no time zone
        ("2001-01-01T00:00:00Z", InvalidInput),  # in the past
        ("9999-12-31T00:00:00Z", TimeOutOfRange),
    ],
)
def test_a_bad_expires_at_is_refused_and_makes_nothing(session: Session, expires_at: str, error: type) -> None:
    with pytest.raises(error):
        make(session, every_seconds=60, expires_at=expires_at)
    assert not Schedule.objects.filter(session=session).exists()
    assert events(session, "schedule/created") == []


# ---------------------------------------------------------------- the clock


def finish_runs(session: Session) -> None:
    """Each fired input taken in by a turn that ended (nothing coalesces)."""
    for e in events(session, "schedule/fired"):
        seq = e["input_seq"]
        if not session.events.filter(kind="user/message", data__source_seq=seq).exists():
            with log.locked(session.id) as tx:
                tx.append("turn/start", {})
                tx.append("user/message", {"text": "x", "source_seq": seq, "lane": "follow_up"})
                tx.append("turn/end", {"status": "completed"})


@pytest.mark.usefixtures("manual_worker")
def test_a_deactivated_owners_schedule_is_cancelled_at_its_next_due_time(session: Session) -> None:
    t0 = timezone.now()
    s = make(session, due_at=t0.isoformat(), every_seconds=60)
    assert tick(now=t0 + timedelta(seconds=1)) == 1
    finish_runs(session)
    session.owner.is_active = False
    session.owner.save()
    assert tick(now=t0 + timedelta(seconds=30)) == 0, "not due yet: nothing happens before its due time"
    s.refresh_from_db()
    assert s.status == "pending"
    assert tick(now=t0 + timedelta(seconds=61)) == 1
    s.refresh_from_db()
    assert (s.status, s.status_reason, s.due_at, s.runs) == ("cancelled", "owner_inactive", None, 1)
    assert cancelled(session) == [{"schedule_id": str(s.id), "reason": "owner_inactive", "by": "terret"}]
    assert len(events(session, "schedule/fired")) == 1
    assert tick(now=t0 + timedelta(seconds=200)) == 0


@pytest.mark.usefixtures("manual_worker")
def test_a_schedule_stops_at_its_expiry(session: Session) -> None:
    t0 = timezone.now()
    # Its next due time lies past the expiry: the firing that ran is its last.
    short = make(session, due_at=t0.isoformat(), every_seconds=60, expires_at=(t0 + timedelta(seconds=30)).isoformat())
    # The workers are down past its expiry: the next tick ends it, unfired.
    longer = make(session, due_at=t0.isoformat(), every_seconds=60, expires_at=(t0 + timedelta(seconds=90)).isoformat())
    assert tick(now=t0 + timedelta(seconds=1)) == 2
    short.refresh_from_db()
    assert (short.status, short.runs, short.due_at) == ("completed", 1, None)
    assert short.status_reason.startswith("expires at")
    longer.refresh_from_db()
    assert (longer.status, longer.runs) == ("pending", 1), "its next due time comes before its expiry"
    finish_runs(session)
    assert tick(now=t0 + timedelta(seconds=200)) == 1
    longer.refresh_from_db()
    assert (longer.status, longer.runs, longer.due_at) == ("completed", 1, None)
    assert longer.status_reason.startswith("expired at")
    assert len(events(session, "schedule/fired")) == 2
    assert tick(now=t0 + timedelta(seconds=400)) == 0


@pytest.mark.usefixtures("manual_worker")
def test_a_max_runs_lowered_to_its_runs_ends_it_unfired(session: Session) -> None:
    t0 = timezone.now()
    s = make(session, due_at=t0.isoformat(), every_seconds=60, max_runs=10)
    tick(now=t0 + timedelta(seconds=1))
    finish_runs(session)
    Schedule.objects.filter(id=s.id).update(max_runs=1)  # an operator, or the upgrade's migration
    assert tick(now=t0 + timedelta(seconds=61)) == 1
    s.refresh_from_db()
    assert (s.status, s.runs, s.status_reason) == ("completed", 1, "ran 1 time(s) of 1")
    assert len(events(session, "schedule/fired")) == 1


FAST = {"TERRET_SCHEDULE_POLL_SECONDS": "0.05", "TERRET_SCHEDULE_GRACE_SECONDS": "1"}


@pytest.mark.worker
def test_under_workers_a_deactivated_owners_schedule_stops_at_its_next_due_time(
    fake_llm: Any, start_worker: Any, session: Session
) -> None:
    """Real worker processes' clocks: the schedule fires, its owner is
    deactivated, and its next due time cancels it instead of firing."""
    fake_llm.responder = lambda request: Reply(text="checked")
    start_worker(name="c1", **FAST)
    start_worker(name="c2", **FAST)
    s = make(session, due_at=(timezone.now() + timedelta(seconds=0.5)).isoformat(), every_seconds=3)
    wait_for(lambda: len(events(session, "turn/end")) == 1, timeout=30, what="the first run's turn")
    session.owner.is_active = False
    session.owner.save()
    deactivated = time.monotonic()
    wait_for(lambda: cancelled(session), timeout=30, what="schedule/cancelled")
    assert time.monotonic() - deactivated < 4, "cancelled at its next due time, not later"
    time.sleep(3.5)  # had it fired again, the event would be here by now
    s.refresh_from_db()
    assert (s.status, s.status_reason, s.runs) == ("cancelled", "owner_inactive", 1)
    assert len(events(session, "schedule/fired")) == 1
    assert cancelled(session)[0]["reason"] == "owner_inactive"
    assert len(fake_llm.requests) == 1


# ---------------------------------------------------------------- what exists today


@pytest.mark.usefixtures("manual_worker")
def test_the_migration_sets_the_bounds_on_existing_rows(session: Session, profile: AgentProfile, settings: Any) -> None:
    settings.TERRET_PROFILE_DAILY_COST_USD = Decimal(40)
    settings.TERRET_PROFILE_DAILY_TOKENS = 5_000
    kept = AgentProfile.objects.create(name="kept", daily_cost_usd=Decimal(3), daily_tokens=None)
    AgentProfile.objects.filter(id=profile.id).update(daily_cost_usd=None, daily_tokens=None)
    t0 = timezone.now()
    recurring = make(session, every_seconds=60)
    own = make(session, cron="*/5 * * * *", max_runs=9)
    once = make(session, due_at=(t0 + timedelta(minutes=5)).isoformat())
    ended = make(session, every_seconds=60)
    Schedule.objects.filter(id=ended.id).update(status="cancelled")
    Schedule.objects.update(max_runs=None, expires_at=None)
    Schedule.objects.filter(id=own.id).update(max_runs=9)
    # Attempts of unknown outcome from before the column: one resolved, one not.
    for n in (1, 2):
        log.append(session.id, "tool/unknown", {"call_id": f"c{n}", "name": "debug.charge", "attempt": 1})
    log.append(session.id, "tool/resolved", {"call_id": "c1", "attempt": 1, "action": "done", "by": "ops"})
    Session.objects.filter(id=session.id).update(unresolved_effects=0)

    existing_rows.forwards(apps, None)

    profile.refresh_from_db()
    kept.refresh_from_db()
    assert (profile.daily_cost_usd, profile.daily_tokens) == (Decimal(40), 5_000)
    assert (kept.daily_cost_usd, kept.daily_tokens) == (Decimal(3), 5_000)
    rows = {s.id: s for s in Schedule.objects.all()}
    assert rows[recurring.id].max_runs == 5
    assert close_enough(rows[recurring.id].expires_at, timezone.now() + timedelta(days=2))
    assert rows[own.id].max_runs == 9 and rows[own.id].expires_at is not None
    assert (rows[once.id].max_runs, rows[once.id].expires_at) == (None, None)
    assert (rows[ended.id].max_runs, rows[ended.id].expires_at) == (None, None)
    assert Session.objects.get(id=session.id).unresolved_effects == 1
