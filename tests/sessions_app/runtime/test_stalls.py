"""Progress-aware liveness, the rule (issue 31.4): a running turn held by a
live lease with no progress for TERRET_STALL_SECONDS is reported once
(turn/stalled {since, phase}), shows on the session, /ops/ and /metrics,
stops standing when anything happens after it, and a profile's
`on_stall: cancel` cancels it. The sweep's part is called directly here, on
rows made to look quiet; tests/.../test_stalls_worker.py has a real worker
and a provider trickling keep-alives."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from sessions_app import log
from sessions_app.log.reads import turn_events
from sessions_app.models import Session
from sessions_app.runtime import lease
from sessions_app.runtime.progress import report_stalls
from sessions_app.runtime.view import TurnState
from tests.helpers import events, kinds
from tests.sessions_app.apiutil import bearer, call, session_url, token_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

STALL = 60.0


@pytest.fixture(autouse=True)
def stall_after(settings: Any) -> None:
    settings.TERRET_STALL_SECONDS = STALL


def running(session: Session, *, quiet_for: float) -> None:
    """An open turn whose first step waits for its model, held by a live
    lease elsewhere, its last event `quiet_for` seconds old."""
    log.append(session.id, "turn/start", {"by": "test"})
    log.append(session.id, "user/message", {"text": "hi"})
    log.append(session.id, "step/start", {"step": 1, "model": "test/model"})
    expires = timezone.now() + timedelta(seconds=60)
    Session.objects.filter(id=session.id).update(lease_owner="elsewhere", lease_gen=1, lease_expires_at=expires)
    quiet(session, quiet_for)


def quiet(session: Session, seconds: float) -> datetime:
    at = timezone.now() - timedelta(seconds=seconds)
    Session.objects.filter(id=session.id).update(last_event_at=at)
    return at


def detail(client: Client, session: Session) -> dict[str, Any]:
    response = call(client, "GET", session_url(session), **bearer(token_for(session.owner)))
    assert response.status_code == 200, response.content
    return response.data


def test_a_quiet_running_turn_is_reported_stalled_once(client: Client, session: Session, make_user: Any) -> None:
    running(session, quiet_for=STALL + 5)
    last = Session.objects.get(id=session.id).last_event_at
    assert detail(client, session)["stalled_since"] is None  # quiet, not reported yet
    assert report_stalls() == []  # a report wakes nobody: the holder is alive
    (stalled,) = events(session, "turn/stalled")
    assert stalled == {"since": last.isoformat(), "phase": "model"}
    for _ in range(3):  # later sweep rounds, and another worker's
        report_stalls()
    assert kinds(session).count("turn/stalled") == 1

    body = detail(client, session)
    assert body["status"] == "running"
    assert datetime.fromisoformat(body["stalled_since"]) == last
    assert body["progress"]["phase"] == "model"
    assert body["progress"]["tools_in_flight"] == []
    # A stall of no progress is no failed attempt of the turn's retries.
    assert TurnState.parse(turn_events(session.id, session_row(session).open_turn_seq)).attempts == 0

    staff = bearer(token_for(make_user("ops", is_staff=True)))
    ops = call(client, "GET", "/api/ops/attention", **staff).data
    assert ops["counts"]["stalled"] == 1
    (item,) = ops["attention"]["stalled"]
    assert (item["kind"], item["session_id"]) == ("stalled", str(session.id))
    assert datetime.fromisoformat(item["since"]) == last
    assert item["detail"]["phase"] == "model"


def test_metrics_and_the_console_show_the_stalled_turn(client: Client, session: Session, make_user: Any) -> None:
    running(session, quiet_for=STALL + 5)
    report_stalls()
    client.force_login(make_user("ops", is_staff=True))
    assert "terret_turns_stalled 1.0" in client.get("/metrics").content.decode()
    page = client.get("/ops/").content.decode()
    assert 'id="h-stalled"' in page
    assert f'data-session="{session.id}"' in page and "no progress, phase model" in page


def test_a_turn_quiet_for_less_or_without_a_live_lease_is_not_stalled(session: Session) -> None:
    running(session, quiet_for=STALL - 10)
    report_stalls()
    assert "turn/stalled" not in kinds(session)
    quiet(session, STALL + 5)
    Session.objects.filter(id=session.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    report_stalls()  # its worker is gone: the sweep drives it again, it is not stalled
    assert "turn/stalled" not in kinds(session)
    Session.objects.filter(id=session.id).update(lease_expires_at=timezone.now() + timedelta(seconds=60))
    Session.objects.filter(id=session.id).update(progress_at=timezone.now() - timedelta(seconds=5))
    report_stalls()  # its model streamed text lately
    assert "turn/stalled" not in kinds(session)


def test_streamed_text_after_the_stall_ends_it_and_a_new_stall_is_reported_again(
    client: Client, session: Session
) -> None:
    running(session, quiet_for=STALL + 5)
    report_stalls()
    assert detail(client, session)["stalled_since"] is not None
    # The holder's keeper wrote a progress mark after the stall (text streamed).
    Session.objects.filter(id=session.id).update(progress_at=timezone.now(), streamed_tokens=7)
    body = detail(client, session)
    assert body["stalled_since"] is None
    assert body["progress"]["streamed_tokens"] == 7
    report_stalls()
    assert kinds(session).count("turn/stalled") == 1
    # Then the stream goes quiet again: a second stall of the same turn.
    resumed = timezone.now() - timedelta(seconds=STALL + 1)
    Session.objects.filter(id=session.id).update(progress_at=resumed)
    quiet(session, STALL + 30)
    report_stalls()
    assert kinds(session).count("turn/stalled") == 2
    assert events(session, "turn/stalled")[-1]["since"] == resumed.isoformat()
    assert datetime.fromisoformat(detail(client, session)["stalled_since"]) == resumed


def test_an_event_after_the_stall_ends_it(client: Client, session: Session) -> None:
    running(session, quiet_for=STALL + 5)
    report_stalls()
    log.append(session.id, "assistant/message", {"content": "at last"})
    assert detail(client, session)["stalled_since"] is None
    assert session_row(session).stalled_seq is not None  # still the turn's latest stall, no longer standing
    log.append(session.id, "step/end", {"step": 1})
    log.append(session.id, "turn/end", {"status": "completed"})
    row = session_row(session)
    assert (row.stalled_seq, row.open_turn_seq) == (None, None)
    assert detail(client, session)["progress"] == {
        "last_event_at": row.last_event_at.isoformat(),
        "phase": None,
        "streamed_tokens": 0,
        "tools_in_flight": [],
    }


def test_a_tool_call_in_flight_shows_with_its_start_and_a_stall_there_says_tool(
    client: Client, session: Session
) -> None:
    running(session, quiet_for=0)
    call_ = {"id": "c1", "name": "debug.sleep", "arguments": json.dumps({"seconds": 600})}
    log.append(session.id, "assistant/message", {"content": None, "tool_calls": [call_]})
    attempt = {"call_id": "c1", "name": "debug.sleep", "attempt": 1, "idempotency_key": "k", "replay": "safe"}
    started = log.append(session.id, "tool/attempt", {**attempt, "fence": 1})
    body = detail(client, session)
    assert body["progress"]["phase"] == "tool"
    at = session.events.get(seq=started.seq).created_at
    assert body["progress"]["tools_in_flight"] == [{"name": "debug.sleep", "since": at.isoformat()}]
    quiet(session, STALL + 5)
    report_stalls()
    assert events(session, "turn/stalled")[0]["phase"] == "tool"


def test_on_stall_cancel_cancels_the_stalled_turn(session: Session) -> None:
    session.profile.on_stall = "cancel"
    session.profile.save()
    running(session, quiet_for=STALL + 5)
    assert report_stalls() == [str(session.id)]  # woken, as a cancel wakes its turn
    assert kinds(session)[-2:] == ["turn/stalled", "turn/cancel_requested"]
    assert events(session, "turn/cancel_requested") == [
        {"by": "stall watch", "reason": "no progress (on_stall: cancel)"}
    ]
    assert session_row(session).cancel_seq is not None


def session_row(session: Session) -> Session:
    return Session.objects.get(id=session.id)


def test_the_progress_mark_rides_the_lease_renewal_only_for_the_holder(session: Session) -> None:
    held = lease.claim(session.id)
    assert held is not None
    lease.keeper.drop(held)  # renewed by hand here, not by the keeper thread
    held.model_call()
    for _ in range(3):
        held.streamed_text()  # what the runner does per streamed text chunk: no write
    row = session_row(session)
    assert (row.progress_at, row.streamed_tokens) == (None, 0)
    assert lease.renew_many([held]) == [held]
    row = session_row(session)
    assert row.streamed_tokens == 3
    assert row.progress_at == datetime.fromtimestamp(held.progress_at or 0, UTC)
    assert held.unwritten_progress() is None  # written: the next renewal carries none
    taken = lease.claim(session.id, ttl=0.5)  # as after an expiry; a takeover bumps the generation
    assert taken is None
    Session.objects.filter(id=session.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    taken = lease.claim(session.id)
    assert taken is not None
    lease.keeper.drop(taken)
    held.streamed_text()  # the old holder's stream goes on, fenced off
    assert lease.renew_many([held]) == []
    assert session_row(session).streamed_tokens == 3
