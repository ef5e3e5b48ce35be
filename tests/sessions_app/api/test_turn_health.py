"""Turn health over the JSON API: a blocked session says why (status
`blocked`, `blocked: {reason, attempts, since}`), one waiting for an agent
slot says so (`waiting`), `POST …/retry` drives a blocked turn again (409
not_blocked otherwise), and cancel says whether the turn is already closed."""

from __future__ import annotations

from datetime import datetime

import pytest

from sessions_app import log
from sessions_app.runtime import lease
from tests.helpers import kinds
from tests.sessions_app.apiutil import (
    bearer,
    block_turn,
    call,
    event_count,
    head,
    make_reviewer,
    new_session,
    park_calls,
    token_for,
)
from tests.sessions_app.apiutil import (
    session_url as url,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


def test_an_idle_session_is_neither_blocked_nor_waiting(client, auth, session):
    body = call(client, "GET", url(session), **auth).data
    assert (body["status"], body["blocked"], body["waiting"]) == ("idle", None, None)


def test_a_blocked_session_says_why_and_since_when(client, auth, session):
    seq = block_turn(session.id, reason="the model provider failed 3 times: 503", attempts=3)
    body = call(client, "GET", url(session), **auth).data
    assert body["status"] == "blocked"
    assert body["blocked"]["reason"] == "the model provider failed 3 times: 503"
    assert body["blocked"]["attempts"] == 3
    assert body["blocked"]["code"] is None  # recorded without a code
    since = datetime.fromisoformat(body["blocked"]["since"])
    assert since.tzinfo is not None
    assert since == session.events.get(seq=seq).created_at
    assert body["waiting"] is None


def test_a_turn_blocked_by_a_context_overflow_says_so_in_its_code(client, auth, session):
    log.append(session.id, "turn/start", {})
    reason = "the request does not fit test/model's context window even after compaction: HTTP 400"
    log.append(session.id, "turn/blocked", {"reason": reason, "attempts": 1, "code": "context_overflow"})
    body = call(client, "GET", url(session), **auth).data
    assert body["status"] == "blocked"
    assert (body["blocked"]["code"], body["blocked"]["reason"]) == ("context_overflow", reason)
    assert body["blocked"]["what"] is None


def test_a_turn_blocked_by_a_missing_definition_names_it(client, auth, session):
    log.append(session.id, "turn/start", {})
    reason = "MCP server 'fx' could not start: exited"
    blocked = {"reason": reason, "attempts": 1, "code": "definition_missing", "what": "mcp_server:fx"}
    log.append(session.id, "turn/blocked", blocked)
    body = call(client, "GET", url(session), **auth).data
    assert body["status"] == "blocked"
    assert (body["blocked"]["code"], body["blocked"]["what"]) == ("definition_missing", "mcp_server:fx")


def test_a_session_waiting_for_an_agent_slot_says_so(client, auth, owner):
    session = new_session(owner, spawned=False)
    log.append(session.id, "input/queued", {"text": "hi", "wake": True})
    log.append(session.id, "agent/waiting", {"reason": "the registry is full: 2 live agents, all busy", "live": 2})
    body = call(client, "GET", url(session), **auth).data
    assert body["waiting"]["reason"] == "the registry is full: 2 live agents, all busy"
    assert datetime.fromisoformat(body["waiting"]["since"]).tzinfo is not None
    assert body["blocked"] is None


def test_retry_drives_a_blocked_turn_again(client, auth, session):
    block_turn(session.id)
    response = call(client, "POST", url(session, "/retry"), **auth)
    assert response.status_code == 202, response.content
    assert response.data == {"status": "running"}
    assert kinds(session)[-1] == "turn/retry_requested"
    assert session.events.order_by("-seq").first().data == {"by": "owner"}
    body = call(client, "GET", url(session), **auth).data
    assert (body["status"], body["blocked"]) == ("running", None)


@pytest.mark.parametrize("state", ["idle", "running", "waiting_approval"])
def test_retry_of_a_session_that_is_not_blocked_is_409_and_appends_nothing(client, auth, session, state):
    if state == "running":
        log.append(session.id, "turn/start", {})
    elif state == "waiting_approval":
        park_calls(session.id, "c1")
    before = head(session.id)
    response = call(client, "POST", url(session, "/retry"), **auth)
    assert response.status_code == 409
    assert response.data["code"] == "not_blocked"
    assert head(session.id) == before


@pytest.mark.parametrize(
    ("role", "status", "code"),
    [
        ("anonymous", 401, "unauthenticated"),
        ("stranger", 404, "unknown_session"),
        ("reviewer", 403, "not_allowed"),
        ("staff", 202, None),
    ],
)
def test_retry_needs_the_owner_or_staff(client, session, make_user, role, status, code):
    block_turn(session.id)
    headers = {}
    if role == "stranger":
        headers = bearer(token_for(make_user("stranger")))
    elif role == "reviewer":
        headers = bearer(token_for(make_reviewer(make_user("reviewer"))))
    elif role == "staff":
        headers = bearer(token_for(make_user("staff", is_staff=True)))
    before = event_count()
    response = call(client, "POST", url(session, "/retry"), **headers)
    assert response.status_code == status, response.content
    if code is None:
        assert session.events.order_by("-seq").first().data == {"by": "staff"}
    else:
        assert response.data["code"] == code
        assert event_count() == before


def test_retry_of_an_unknown_session_is_404(client, auth):
    response = call(client, "POST", "/api/sessions/00000000-0000-0000-0000-000000000000/retry", **auth)
    assert (response.status_code, response.data["code"]) == (404, "unknown_session")


def test_cancel_of_a_blocked_turn_closes_it_at_once(client, auth, session):
    block_turn(session.id)
    response = call(client, "POST", url(session, "/cancel"), **auth)
    assert response.data == {"cancelled": True, "closed": True}
    assert kinds(session)[-2:] == ["turn/cancel_requested", "turn/end"]
    body = call(client, "GET", url(session), **auth).data
    assert (body["status"], body["blocked"]) == ("idle", None)


def test_cancel_of_a_turn_a_worker_holds_is_left_to_the_worker(client, auth, session):
    log.append(session.id, "turn/start", {})
    held = lease.claim(session.id, ttl=30)
    assert held is not None
    try:
        response = call(client, "POST", url(session, "/cancel"), **auth)
        assert response.data == {"cancelled": True, "closed": False}
        assert kinds(session)[-1] == "turn/cancel_requested"  # the worker stops the stream and ends the turn
        assert call(client, "GET", url(session), **auth).data["status"] == "running"
    finally:
        lease.release(held)


def test_the_openapi_document_describes_retry_blocked_waiting_and_closed(client):
    doc = client.get("/api/openapi.json").json()
    retry = doc["paths"]["/api/sessions/{session_id}/retry"]["post"]
    assert {"202", "409"} <= set(retry["responses"])
    schemas = doc["components"]["schemas"]
    assert set(schemas["SessionOut"]["properties"]["status"]["enum"]) == {
        "idle",
        "running",
        "waiting_approval",
        "waiting_task",
        "waiting_reconcile",
        "blocked",
        "suspended",
        "revoked",
    }
    assert {"blocked", "waiting"} <= set(schemas["SessionOut"]["required"])
    assert set(schemas["BlockedOut"]["properties"]) == {"reason", "attempts", "code", "what", "since"}
    assert set(schemas["WaitingOut"]["properties"]) == {"reason", "since"}
    assert set(schemas["CancelOut"]["properties"]) == {"cancelled", "closed"}
