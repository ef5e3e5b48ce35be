"""The /lg/ door's edges with Django's test client (no worker): auth by
x-api-key or Bearer, the API's permission answers, CORS, bad input that
changes nothing, and refusals (rollback, stale checkpoints' forks aside)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from sessions_app import log
from sessions_app.models import Event, Session
from tests.sessions_app.apiutil import park_calls, token_for
from tests.sessions_app.lg.conftest import PROFILE


def post(client: Client, url: str, body: Any, **headers: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json", **headers)


@pytest.fixture
def thread(client: Client, lg_token: str) -> str:
    return post(client, "/lg/threads", {"metadata": {"graph_id": PROFILE}}, HTTP_X_API_KEY=lg_token).json()["thread_id"]


def test_tokens_by_x_api_key_or_bearer_and_nothing_else(client: Client, lg_token: str, thread: str) -> None:
    assert client.get(f"/lg/threads/{thread}", HTTP_X_API_KEY=lg_token).status_code == 200
    assert client.get(f"/lg/threads/{thread}", HTTP_AUTHORIZATION=f"Bearer {lg_token}").status_code == 200
    refused = client.get(f"/lg/threads/{thread}")
    assert refused.status_code == 401 and refused.json()["code"] == "unauthenticated"
    assert client.get(f"/lg/threads/{thread}", HTTP_X_API_KEY="trt_nope").status_code == 401


def test_another_users_thread_is_unknown(client: Client, make_user: Any, thread: str) -> None:
    other = token_for(make_user("stranger"))
    answer = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=other)
    assert answer.status_code == 404 and answer.json()["code"] == "unknown_session"
    assert post(client, "/lg/threads/search", {}, HTTP_X_API_KEY=other).json() == []


def test_cors_for_listed_origins_only(client: Client, settings: Any, lg_token: str) -> None:
    settings.TERRET_LG_CORS_ORIGINS = ["http://ui.example"]
    pre = client.options("/lg/threads", HTTP_ORIGIN="http://ui.example", HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST")
    assert pre.status_code == 204 and pre["Access-Control-Allow-Origin"] == "http://ui.example"
    assert "x-api-key" in pre["Access-Control-Allow-Headers"]
    got = client.get("/lg/info", HTTP_ORIGIN="http://ui.example", HTTP_X_API_KEY=lg_token)
    assert got["Access-Control-Expose-Headers"] == "Content-Location, Location"
    foreign = client.get("/lg/info", HTTP_ORIGIN="http://evil.example", HTTP_X_API_KEY=lg_token)
    assert not foreign.has_header("Access-Control-Allow-Origin")


def test_unknown_fields_are_ignored_and_bad_input_changes_nothing(client: Client, lg_token: str, thread: str) -> None:
    events = Event.objects.count()
    url = f"/lg/threads/{thread}/runs"
    for body, code in [
        ({"assistant_id": PROFILE, "input": {"messages": [{"role": "ai", "content": "x"}]}}, "invalid_input"),
        ({"assistant_id": PROFILE, "input": {"messages": []}, "whatever": 1}, "invalid_input"),
        ({"assistant_id": PROFILE, "input": {"messages": ["hi"]}, "multitask_strategy": "rollback"}, "not_supported"),
        ({"assistant_id": "nobody", "input": {"messages": ["hi"]}}, "invalid_input"),
        ({"assistant_id": PROFILE, "command": {"resume": {"decisions": []}}}, "run_not_active"),
        ({"assistant_id": PROFILE, "input": {"messages": ["hi"]}, "checkpoint_id": "seq-x"}, "invalid_input"),
    ]:
        answer = post(client, url, body, HTTP_X_API_KEY=lg_token)
        assert answer.json()["code"] == code, (body, answer.json())
        assert answer.json()["detail"] == answer.json()["message"]
    assert Event.objects.count() == events
    bad = client.post(url, data="{nope", content_type="application/json", HTTP_X_API_KEY=lg_token)
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_json"
    assert client.get("/lg/no/such/path", HTTP_X_API_KEY=lg_token).json()["code"] == "not_found"


@pytest.mark.django_db(transaction=True)  # the streaming view reads from its own threads
def test_an_unknown_stream_mode_is_refused_before_anything_runs(client: Client, lg_token: str, thread: str) -> None:
    events = Event.objects.count()
    for modes in (["values", "bogus"], 7):
        body = {"assistant_id": PROFILE, "input": {"messages": ["hi"]}, "stream_mode": modes}
        answer = post(client, f"/lg/threads/{thread}/runs/stream", body, HTTP_X_API_KEY=lg_token)
        assert answer.status_code == 400 and answer.json()["code"] == "invalid_input"
    assert Event.objects.count() == events


def test_a_parked_step_is_one_interrupt_and_a_short_resume_changes_nothing(
    client: Client, lg_token: str, thread: str
) -> None:
    park_calls(Session.objects.get(id=thread).id, "call_a", "call_b")
    state = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=lg_token).json()
    (interrupt,) = state["interrupts"]
    assert [a["name"] for a in interrupt["value"]["action_requests"]] == ["workspace.write", "workspace.write"]
    assert state["next"] == ["tools"] and state["tasks"][0]["interrupts"] == [interrupt]
    events = Event.objects.count()
    short = {"assistant_id": PROFILE, "command": {"resume": {"decisions": [{"type": "approve"}]}}}
    assert post(client, f"/lg/threads/{thread}/runs", short, HTTP_X_API_KEY=lg_token).json()["code"] == "invalid_input"
    edit_tool = {
        "assistant_id": PROFILE,
        "command": {
            "resume": {
                "decisions": [
                    {"type": "approve"},
                    {"type": "edit", "edited_action": {"name": "clock.now", "arguments": {}}},
                ]
            }
        },
    }
    answer = post(client, f"/lg/threads/{thread}/runs", edit_tool, HTTP_X_API_KEY=lg_token)
    assert answer.json()["code"] == "not_supported"
    assert Event.objects.count() == events, "validated before any verdict is applied"


def test_a_resume_after_the_interrupt_expired_is_approval_expired(client: Client, lg_token: str, thread: str) -> None:
    """The approval clock's expiry (on_expiry deny) settles the request: the
    thread is no longer interrupted, and a late resume is refused 409
    approval_expired, changing nothing."""
    sid = Session.objects.get(id=thread).id
    park_calls(sid, "call_a")
    request = Event.objects.get(session_id=sid, kind="approval/requested")
    expiry = {"call_id": "call_a", "request_seq": request.seq, "deadline_s": 5, "on_expiry": "deny"}
    log.append(sid, "approval/expired", expiry)
    state = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=lg_token).json()
    assert state["interrupts"] == []
    events = Event.objects.count()
    resume = {"assistant_id": PROFILE, "command": {"resume": {"decisions": [{"type": "approve"}]}}}
    answer = post(client, f"/lg/threads/{thread}/runs", resume, HTTP_X_API_KEY=lg_token)
    assert answer.status_code == 409 and answer.json()["code"] == "approval_expired", answer.json()
    assert Event.objects.count() == events
