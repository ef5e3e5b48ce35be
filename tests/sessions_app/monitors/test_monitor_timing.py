"""A monitor's timing is a schedule's: the same misfire policies after
downtime, the same next due times, the same bounds (max_runs, expires_at,
the profile's when the request gave none). Each misfire test runs a schedule
and a monitor with the same timing through the same downtime, on their own
clocks, and holds both to the same expected outcome: a divergence of either
fails it. Runs on SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from sessions_app.errors import InvalidInput
from sessions_app.models import Edition, Event, Monitor, Schedule
from sessions_app.monitors import run
from sessions_app.runtime import schedules as schedule_clock
from sessions_app.services import monitors, schedules
from tests.sessions_app.monitors.conftest import EditionReceiver, FeedServer

pytestmark = pytest.mark.django_db


def body(feed: FeedServer, receiver: EditionReceiver, **schedule: Any) -> dict[str, Any]:
    return {
        "schedule": schedule,
        "sources": [{"kind": "feed", "url": feed.url}],
        "destination": {"kind": "webhook", "url": receiver.url},
    }


@pytest.mark.usefixtures("manual_worker")
@pytest.mark.parametrize("policy", ["skip", "run_once", "reschedule"])
def test_misfire_after_downtime_is_the_schedules(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, policy: str
) -> None:
    """Due at t0, every 60 s; no clock ran until t0 + 190 s (due times t0, +60, +120, +180 passed; the grace
    is 60 s). `skip` runs nothing for them (no schedule firing, no period, nothing sent) and keeps the phase;
    `run_once` runs once and keeps the phase; `reschedule` runs once and restarts the interval from now."""
    t0 = timezone.now() - timedelta(seconds=190)
    now = t0 + timedelta(seconds=190)
    s, _ = schedules.create(session.id, {"text": "wake", "every_seconds": 60, "misfire": policy}, by="owner")
    m, _ = monitors.create(session.id, body(feed_server, edition_receiver, every_seconds=60, misfire=policy), by="o")
    Schedule.objects.filter(id=s.id).update(due_at=t0)
    Monitor.objects.filter(id=m.id).update(due_at=t0)
    feed_server.add(2)

    schedule_clock.tick(now=now)
    run.tick(now=now)
    s.refresh_from_db()
    m.refresh_from_db()

    expected = t0 + timedelta(seconds=240) if policy != "reschedule" else now + timedelta(seconds=60)
    assert s.due_at == expected and m.due_at == expected
    fired = Event.objects.filter(session_id=session.id, kind="schedule/fired").count()
    if policy == "skip":
        assert (s.runs, s.skipped, fired) == (0, 1, 0)
        assert m.periods == 0 and not Edition.objects.filter(monitor=m).exists()
        assert feed_server.requests == 0 and edition_receiver.posts == 0
        assert "misfire: 4 due time(s) passed" in m.status_reason
        # The next due time runs normally, and collects what the skipped interval held: nothing is lost.
        run.tick(now=expected)
        e = Edition.objects.get(monitor=m)
        assert e.status == "confirmed" and len(e.items) == 2
    else:
        assert (s.runs, fired) == (1, 1)
        assert m.periods == 1
        e = Edition.objects.get(monitor=m)
        assert e.status == "confirmed" and len(e.items) == 2
        assert edition_receiver.posts == 1  # one period for all the missed due times


def test_within_the_grace_every_policy_runs(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    t0 = timezone.now() - timedelta(seconds=30)
    m, _ = monitors.create(session.id, body(feed_server, edition_receiver, every_seconds=60, misfire="skip"), by="o")
    Monitor.objects.filter(id=m.id).update(due_at=t0)
    run.tick(now=t0 + timedelta(seconds=30))
    m.refresh_from_db()
    assert m.periods == 1 and m.due_at == t0 + timedelta(seconds=60)


def test_bounds_complete_the_monitor_as_they_complete_a_schedule(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    session.profile.schedule_max_runs = 5
    session.profile.save(update_fields=["schedule_max_runs"])
    by_profile, _ = monitors.create(session.id, body(feed_server, edition_receiver, every_seconds=3600), by="o")
    assert by_profile.max_runs == 5  # the profile's bound, as a schedule gets it
    assert monitors.as_json(by_profile)["schedule"]["max_runs"] == 5
    m, _ = monitors.create(session.id, body(feed_server, edition_receiver, every_seconds=3600, max_runs=2), by="o")
    for n in (1, 2):
        feed_server.add(1)
        edition_receiver.modes = ["drop"] if n == 2 else []
        Monitor.objects.filter(id=m.id).update(due_at=timezone.now() - timedelta(seconds=1))
        run.tick()
        m.refresh_from_db()
        assert m.periods == n
    assert m.status == "completed" and m.due_at is None and "ran 2 time(s) of 2" in m.status_reason
    # Its last edition was sent, and its unknown outcome is still reconciled after the monitor completed.
    last = Edition.objects.get(monitor=m, period=2)
    assert last.status == "unknown" and edition_receiver.posts == 2
    Edition.objects.filter(id=last.id).update(updated_at=timezone.now() - timedelta(hours=1))
    run.tick()
    last.refresh_from_db()
    assert last.status == "confirmed" and edition_receiver.posts == 3 and len(edition_receiver.accepted) == 2
    m.refresh_from_db()
    assert m.status == "completed" and m.periods == 2  # settled, no further period

    soon = (timezone.now() + timedelta(hours=2)).isoformat()
    m2, _ = monitors.create(
        session.id, body(feed_server, edition_receiver, every_seconds=3600, expires_at=soon), by="o"
    )
    run.tick(now=timezone.now() + timedelta(hours=3))  # past its expiry: it ends, no period
    m2.refresh_from_db()
    assert m2.status == "completed" and m2.periods == 0 and "expired" in m2.status_reason


def test_schedule_fields_are_checked_as_a_schedules(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    for bad in (
        {"every_seconds": 3600, "misfire": "sometimes"},
        {"every_seconds": 3600, "budget_tokens": 5},
        {"every_seconds": 3600, "max_runs": 0},
        {"every_seconds": 3600, "expires_at": "2001-01-01T00:00:00Z"},
    ):
        with pytest.raises(InvalidInput):
            monitors.create(session.id, body(feed_server, edition_receiver, **bad), by="o")
    assert not Monitor.objects.exists()
