"""The HTTP door to input lanes and schedules: lanes and multitask
strategies on POST inputs, receipts read back, withdraw, and the schedules
endpoints, each with its errors and permissions (docs/protocol.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from sessions_app import services
from sessions_app.models import AgentProfile, Event, Schedule
from sessions_app.runtime.drive import drive
from tests.fakes.fake_llm import Reply
from tests.sessions_app.apiutil import bearer, call, event_count, head, token_for
from tests.sessions_app.apiutil import session_url as url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


def soon(seconds: float = 60) -> str:
    return (timezone.now() + timedelta(seconds=seconds)).isoformat()


def test_lanes_and_receipts_over_http(client: Any, auth: Any, session: Any, fake_llm: Any) -> None:
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    r = call(client, "POST", url(session, "/inputs"), {"text": "start"}, **auth)
    assert r.status_code == 202 and r.data["disposition"] == "started"
    f = call(client, "POST", url(session, "/inputs"), {"text": "next", "lane": "follow_up"}, **auth)
    assert (f.status_code, f.data["disposition"], f.data["lane"]) == (202, "queued", "follow_up")
    got = call(client, "GET", url(session, f"/inputs/{f.data['seq']}"), **auth)
    assert (got.status_code, got.data["disposition"]) == (200, "queued")
    before = event_count()
    busy = call(client, "POST", url(session, "/inputs"), {"text": "x", "multitask_strategy": "reject"}, **auth)
    assert (busy.status_code, busy.data["code"]) == (409, "turn_already_running")
    assert event_count() == before
    assert drive(session.id) == "ended"
    got = call(client, "GET", url(session, f"/inputs/{f.data['seq']}"), **auth)
    assert got.data["disposition"] == "answered" and got.data["answered_seq"] <= head(session.id)
    assert got.data["placed_seq"] > f.data["seq"]
    missing = call(client, "GET", url(session, "/inputs/999999"), **auth)
    assert (missing.status_code, missing.data["code"]) == (404, "unknown_input")


def test_withdraw_over_http(client: Any, auth: Any, session: Any) -> None:
    services.run_turn(session.id, "busy")
    p = call(client, "POST", url(session, "/inputs"), {"text": "note", "lane": "passive"}, **auth)
    w = call(client, "POST", url(session, f"/inputs/{p.data['seq']}/withdraw"), **auth)
    assert (w.status_code, w.data["disposition"]) == (200, "withdrawn")
    assert Event.objects.filter(session=session, kind="input/withdrawn").count() == 1
    opened = Event.objects.filter(session=session, kind="user/message").values_list("seq", flat=True).first()
    no = call(client, "POST", url(session, f"/inputs/{opened}/withdraw"), **auth)
    assert (no.status_code, no.data["code"]) == (409, "input_consumed")
    bad = call(client, "POST", url(session, "/inputs"), {"text": "x", "lane": "sideways"}, **auth)
    assert bad.status_code == 400


def test_others_may_neither_read_nor_withdraw(client: Any, session: Any, make_user: Any) -> None:
    services.run_turn(session.id, "busy")
    r = services.inject(session.id, "queued", lane="follow_up")
    stranger = bearer(token_for(make_user("stranger")))
    for method, tail in (("GET", f"/inputs/{r.seq}"), ("POST", f"/inputs/{r.seq}/withdraw"), ("GET", "/schedules")):
        resp = call(client, method, url(session, tail), **stranger)
        assert (resp.status_code, resp.data["code"]) == (404, "unknown_session")
    resp = call(client, "POST", url(session, "/schedules"), {"text": "t", "due_at": soon()}, **stranger)
    assert resp.status_code == 404 and Schedule.objects.count() == 0


def test_schedules_over_http(client: Any, auth: Any, session: Any) -> None:
    AgentProfile.objects.filter(id=session.profile_id).update(min_schedule_seconds=60, max_schedules=2)
    body = {"text": "check the feed", "every_seconds": 3600, "idempotency_key": "feed", "misfire": "skip"}
    made = call(client, "POST", url(session, "/schedules"), body, **auth)
    assert made.status_code == 201
    s = made.data
    assert (s["status"], s["runs"], s["misfire"], s["last_outcome"]) == ("pending", 0, "skip", None)
    assert s["next_due_at"] is not None
    again = call(client, "POST", url(session, "/schedules"), body, **auth)
    assert (again.status_code, again.data["id"]) == (200, s["id"])
    clash = call(client, "POST", url(session, "/schedules"), {**body, "text": "other"}, **auth)
    assert (clash.status_code, clash.data["code"]) == (409, "idempotency_conflict")
    too_often = call(client, "POST", url(session, "/schedules"), {"text": "t", "every_seconds": 5}, **auth)
    assert (too_often.status_code, too_often.data["code"]) == (422, "schedule_limit")
    bad = call(client, "POST", url(session, "/schedules"), {"text": "t", "cron": "nope"}, **auth)
    assert (bad.status_code, bad.data["code"]) == (400, "invalid_input")
    for when in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-14:00", "2099-01-01T00:00:00Z"):
        far = call(client, "POST", url(session, "/schedules"), {"text": "t", "due_at": when}, **auth)
        assert (far.status_code, far.data["code"]) == (400, "time_out_of_range"), when
    listed = call(client, "GET", url(session, "/schedules"), **auth)
    assert [x["id"] for x in listed.data["schedules"]] == [s["id"]]
    gone = call(client, "DELETE", url(session, f"/schedules/{s['id']}"), **auth)
    assert (gone.status_code, gone.data["status"], gone.data["next_due_at"]) == (200, "cancelled", None)
    assert Event.objects.filter(session=session, kind="schedule/cancelled").count() == 1
    unknown = call(client, "DELETE", url(session, "/schedules/not-a-uuid"), **auth)
    assert (unknown.status_code, unknown.data["code"]) == (404, "unknown_schedule")
