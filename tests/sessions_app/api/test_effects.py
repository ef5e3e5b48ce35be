"""The effect ledger over the JSON API: `GET …/effects` lists every attempt
with its state, `POST …/effects/{call_id}/resolve` answers one of unknown
outcome (staff; the owner with TERRET_OWNER_MAY_RESOLVE), and the session
reports `waiting_reconcile` with its `unknown_effects` meanwhile. A refused
resolve appends nothing; an accepted one appends exactly one tool/resolved."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import pytest
from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret
from django.test import Client

from sessions_app import actions as ops
from sessions_app import log, services
from sessions_app.models import Session
from tests.helpers import events, kinds
from tests.sessions_app.apiutil import bearer, call, event_count, head, make_reviewer, token_for
from tests.sessions_app.apiutil import session_url as url

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


# ---------------------------------------------------------------- log states


def tool_message(sid: uuid.UUID, *call_ids: str, tool: str = "workspace.write") -> int:
    """An assistant/message calling `call_ids`; its seq."""
    calls = [{"id": c, "name": tool, "arguments": json.dumps({"path": f"{c}.txt", "text": "x"})} for c in call_ids]
    return log.append(sid, "assistant/message", {"content": None, "tool_calls": calls}).seq


def attempt(
    sid: uuid.UUID, message_seq: int, call_id: str, number: int = 1, *, tool: str = "workspace.write", replay="never"
) -> int:
    data = {
        "call_id": call_id,
        "name": tool,
        "attempt": number,
        "idempotency_key": f"terret:{sid}:{message_seq}:{call_id}",
        "replay": replay,
        "fence": 3,
        "step": 1,
        "worker": "worker-a:17",
    }
    return log.append(sid, "tool/attempt", data).seq


def unknown(sid: uuid.UUID, call_id: str, number: int = 1, *, tool: str = "workspace.write") -> int:
    data = {"call_id": call_id, "name": tool, "attempt": number, "reason": "its worker died"}
    return log.append(sid, "tool/unknown", data).seq


def waiting_on(sid: uuid.UUID, *call_ids: str) -> int:
    """An open turn whose `call_ids` each have an attempt of unknown outcome,
    as a resume leaves it; the turn/start seq."""
    turn = services.run_turn(sid, "write the files")
    message = tool_message(sid, *call_ids)
    for c in call_ids:
        attempt(sid, message, c)
    for c in call_ids:
        unknown(sid, c)
    return turn


def last_resolved(session: Any) -> dict[str, Any]:
    return events(session, "tool/resolved")[-1]


@pytest.fixture
def staff(make_user: Any) -> dict[str, str]:
    return bearer(token_for(make_user("operator", is_staff=True)))


# ---------------------------------------------------------------- the session's status


def test_a_session_waiting_on_an_unknown_effect_says_waiting_reconcile(client, auth, session):
    assert call(client, "GET", url(session), **auth).data["unknown_effects"] == 0
    waiting_on(session.id, "c1", "c2")
    body = call(client, "GET", url(session), **auth).data
    assert (body["status"], body["unknown_effects"], body["blocked"]) == ("waiting_reconcile", 2, None)


def test_the_socket_hello_state_carries_the_status_and_the_count(session):
    waiting_on(session.id, "c1")
    state = ops.live_state(session.id)
    assert (state["status"], state["unknown_effects"]) == ("waiting_reconcile", 1)


def test_a_blocked_turn_with_an_unknown_effect_reports_blocked_first(client, auth, session):
    waiting_on(session.id, "c1")
    log.append(session.id, "turn/blocked", {"reason": "503", "attempts": 3})
    body = call(client, "GET", url(session), **auth).data
    assert (body["status"], body["unknown_effects"]) == ("blocked", 1)


# ---------------------------------------------------------------- the listing


def test_the_listing_gives_every_attempt_with_its_state(client, auth, session):
    sid = session.id
    services.run_turn(sid, "go")
    message = tool_message(sid, "ok", "bad", "lost", "fixed", "live")
    at = attempt(sid, message, "ok")
    log.append(sid, "tool/result", {"call_id": "ok", "name": "workspace.write", "content": "wrote", "attempt": 1})
    attempt(sid, message, "bad")
    log.append(
        sid,
        "tool/result",
        {"call_id": "bad", "name": "workspace.write", "content": "disk full", "is_error": True, "attempt": 1},
    )
    attempt(sid, message, "lost")
    unknown(sid, "lost")
    attempt(sid, message, "fixed")
    unknown(sid, "fixed")
    log.append(sid, "tool/resolved", {"call_id": "fixed", "attempt": 1, "action": "failed", "by": "root"})
    attempt(sid, message, "live")

    response = call(client, "GET", url(session, "/effects"), **auth)
    assert response.status_code == 200, response.content
    body = response.data
    states = {e["call_id"]: e["state"] for e in body["effects"]}
    assert states == {"ok": "done", "bad": "failed", "lost": "unknown", "fixed": "resolved", "live": "in_flight"}
    assert body["pending"] == 1
    first = body["effects"][0]
    assert first["call_id"] == "ok"
    assert first["tool"] == "workspace.write" and first["attempt"] == 1 and first["replay"] == "never"
    assert first["idempotency_key"] == f"terret:{sid}:{message}:ok"
    assert json.loads(first["arguments"]) == {"path": "ok.txt", "text": "x"}
    assert (first["step"], first["worker"], first["fence"]) == (1, "worker-a:17", 3)
    assert first["attempt_seq"] == at and first["turn_open"] is True
    assert first["result"] == "wrote" and first["resolution"] is None
    assert datetime.fromisoformat(first["attempted_at"]) == session.events.get(seq=at).created_at
    fixed = next(e for e in body["effects"] if e["call_id"] == "fixed")
    assert fixed["resolution"] == {"call_id": "fixed", "attempt": 1, "action": "failed", "by": "root"}


def test_an_empty_ledger(client, auth, session):
    assert call(client, "GET", url(session, "/effects"), **auth).data == {"effects": [], "pending": 0}


@pytest.mark.parametrize(("role", "status"), [("anonymous", 401), ("stranger", 404), ("reviewer", 200), ("staff", 200)])
def test_the_listing_is_for_whoever_may_read_the_session(client, session, make_user, role, status):
    waiting_on(session.id, "c1")
    headers: dict[str, str] = {}
    if role == "stranger":
        headers = bearer(token_for(make_user("stranger")))
    elif role == "reviewer":
        headers = bearer(token_for(make_reviewer(make_user("reviewer"))))
    elif role == "staff":
        headers = bearer(token_for(make_user("staff", is_staff=True)))
    response = call(client, "GET", url(session, "/effects"), **headers)
    assert response.status_code == status, response.content
    if status == 200:
        assert response.data["pending"] == 1


# ---------------------------------------------------------------- resolving


def test_staff_marks_an_effect_done_and_the_turn_carries_on(client, staff, session):
    waiting_on(session.id, "c1")
    before = head(session.id)
    response = call(
        client,
        "POST",
        url(session, "/effects/c1/resolve"),
        {"action": "done", "result": "it was written", "reason": "checked the disk"},
        **staff,
    )
    assert response.status_code == 200, response.content
    assert response.data["status"] == "running"
    resolved = response.data["resolved"]
    assert (resolved["call_id"], resolved["attempt"], resolved["state"]) == ("c1", 1, "unknown")  # as it was
    assert kinds(session, after=before) == ["tool/resolved"]
    assert last_resolved(session) == {
        "call_id": "c1",
        "attempt": 1,
        "action": "done",
        "by": "operator",
        "result": "it was written",
        "reason": "checked the disk",
    }
    row = Session.objects.get(id=session.id)
    assert (row.status, row.unknown_effects) == ("running", 0)
    listed = call(client, "GET", url(session, "/effects"), **staff).data
    assert listed["pending"] == 0 and listed["effects"][0]["state"] == "resolved"


def test_one_of_two_resolved_keeps_the_session_waiting(client, staff, session):
    waiting_on(session.id, "c1", "c2")
    response = call(client, "POST", url(session, "/effects/c2/resolve"), {"action": "rerun"}, **staff)
    assert response.status_code == 200, response.content
    assert response.data["status"] == "waiting_reconcile"
    assert last_resolved(session) == {"call_id": "c2", "attempt": 1, "action": "rerun", "by": "operator"}
    assert call(client, "GET", url(session), **staff).data["unknown_effects"] == 1


def test_mark_failed_with_a_reason(client, staff, session):
    waiting_on(session.id, "c1")
    response = call(client, "POST", url(session, "/effects/c1/resolve"), {"action": "failed", "reason": "no"}, **staff)
    assert response.status_code == 200, response.content
    assert last_resolved(session)["action"] == "failed" and last_resolved(session)["reason"] == "no"


def test_an_unknown_effect_of_an_ended_turn_can_be_marked_but_not_rerun(client, staff, session):
    waiting_on(session.id, "c1")
    services.cancel(session.id, by="owner")  # no worker holds it: it closes at once
    assert Session.objects.get(id=session.id).open_turn_seq is None
    assert call(client, "GET", url(session, "/effects"), **staff).data["pending"] == 1
    before = event_count()
    rerun = call(client, "POST", url(session, "/effects/c1/resolve"), {"action": "rerun"}, **staff)
    assert (rerun.status_code, rerun.data["code"]) == (409, "effect_not_pending")
    assert event_count() == before
    done = call(client, "POST", url(session, "/effects/c1/resolve"), {"action": "done"}, **staff)
    assert done.status_code == 200, done.content
    assert done.data["status"] == "idle"


# ---------------------------------------------------------------- validation: nothing appended


@pytest.mark.parametrize(
    ("call_id", "body", "status", "code"),
    [
        ("c1", {"action": "undo"}, 400, "invalid_input"),
        ("c1", {"action": "rerun", "result": "it ran"}, 400, "invalid_input"),
        ("c1", {}, 400, "invalid_input"),
        ("c1", {"action": "done", "extra": 1}, 400, "invalid_input"),
        ("c1", {"action": "done", "result": 7}, 400, "invalid_input"),
        ("c1", {"action": "done", "result": "x" * 20_001}, 400, "invalid_input"),
        ("c1", {"action": "failed", "reason": "bad\u0000"}, 400, "invalid_input"),
        ("nope", {"action": "done"}, 404, "unknown_effect"),
    ],
)
def test_a_bad_resolve_is_refused_and_appends_nothing(client, staff, session, call_id, body, status, code):
    waiting_on(session.id, "c1")
    before = event_count()
    response = call(client, "POST", url(session, f"/effects/{call_id}/resolve"), body, **staff)
    assert (response.status_code, response.data["code"]) == (status, code), response.content
    assert event_count() == before


def test_resolving_twice_is_409_the_second_time(client, staff, session):
    waiting_on(session.id, "c1")
    assert call(client, "POST", url(session, "/effects/c1/resolve"), {"action": "done"}, **staff).status_code == 200
    before = event_count()
    again = call(client, "POST", url(session, "/effects/c1/resolve"), {"action": "failed"}, **staff)
    assert (again.status_code, again.data["code"]) == (409, "effect_not_pending")
    assert event_count() == before
    assert len(events(session, "tool/resolved")) == 1


def test_an_effect_with_its_outcome_is_not_pending(client, staff, session):
    services.run_turn(session.id, "go")
    message = tool_message(session.id, "c1")
    attempt(session.id, message, "c1")
    log.append(session.id, "tool/result", {"call_id": "c1", "name": "workspace.write", "content": "ok", "attempt": 1})
    before = event_count()
    response = call(client, "POST", url(session, "/effects/c1/resolve"), {"action": "done"}, **staff)
    assert (response.status_code, response.data["code"]) == (409, "effect_not_pending")
    assert event_count() == before


# ---------------------------------------------------------------- who may resolve


@pytest.mark.parametrize(
    ("role", "owner_may", "status", "code"),
    [
        ("anonymous", False, 401, "unauthenticated"),
        ("owner", False, 403, "not_allowed"),
        ("owner", True, 200, None),
        ("owner_cookie", True, 200, None),
        ("staff", False, 200, None),
        ("reviewer", True, 403, "not_allowed"),
        ("stranger", True, 404, "unknown_session"),
        ("inactive_staff", False, 401, "unauthenticated"),
    ],
)
def test_who_may_resolve(session, make_user, settings, role, owner_may, status, code):
    settings.TERRET_OWNER_MAY_RESOLVE = owner_may
    waiting_on(session.id, "c1")
    client = Client(enforce_csrf_checks=True)
    headers: dict[str, str] = {}
    expected_by = role
    if role == "owner":
        headers = bearer(token_for(session.owner))
    elif role == "owner_cookie":
        client.force_login(session.owner)
        secret = _get_new_csrf_string()
        client.cookies["csrftoken"] = secret
        headers = {"HTTP_X_CSRFTOKEN": _mask_cipher_secret(secret)}
        expected_by = "owner"
    elif role == "staff":
        headers = bearer(token_for(make_user("staff", is_staff=True)))
    elif role == "reviewer":
        headers = bearer(token_for(make_reviewer(make_user("reviewer"))))
    elif role == "stranger":
        headers = bearer(token_for(make_user("stranger")))
    elif role == "inactive_staff":
        user = make_user("gone", is_staff=True)
        headers = bearer(token_for(user))
        user.is_active = False
        user.save()
    before = event_count()
    response = call(client, "POST", url(session, "/effects/c1/resolve"), {"action": "done"}, **headers)
    assert response.status_code == status, response.content
    if code is None:
        assert event_count() == before + 1
        assert last_resolved(session)["by"] == expected_by
    else:
        assert response.data["code"] == code
        assert event_count() == before


def test_cookie_auth_without_csrf_is_refused(session, settings):
    settings.TERRET_OWNER_MAY_RESOLVE = True
    waiting_on(session.id, "c1")
    client = Client(enforce_csrf_checks=True)
    client.force_login(session.owner)
    before = event_count()
    response = call(client, "POST", url(session, "/effects/c1/resolve"), {"action": "done"})
    assert (response.status_code, response.data["code"]) == (403, "csrf_failed")
    assert event_count() == before


def test_unknown_session_is_404_for_staff(client, staff):
    sid = "00000000-0000-4000-8000-000000000000"
    for method, tail, body in (("GET", "/effects", None), ("POST", "/effects/c1/resolve", {"action": "done"})):
        response = call(client, method, f"/api/sessions/{sid}{tail}", body, **staff)
        assert (response.status_code, response.data["code"]) == (404, "unknown_session")


# ---------------------------------------------------------------- the OpenAPI document


def test_the_openapi_document_describes_the_effect_endpoints(client):
    doc = client.get("/api/openapi.json").json()
    listing = doc["paths"]["/api/sessions/{session_id}/effects"]["get"]
    resolve = doc["paths"]["/api/sessions/{session_id}/effects/{call_id}/resolve"]["post"]
    assert {"200", "401", "404"} <= set(listing["responses"])
    assert {"200", "400", "401", "403", "404", "409"} <= set(resolve["responses"])
    schemas = doc["components"]["schemas"]
    assert set(schemas["ResolveIn"]["properties"]) == {"action", "result", "reason"}
    assert set(schemas["ResolveIn"]["properties"]["action"]["enum"]) == {"rerun", "done", "failed"}
    assert set(schemas["EffectOut"]["properties"]["state"]["enum"]) == {
        "in_flight",
        "done",
        "failed",
        "unknown",
        "resolved",
        "superseded",
    }
    assert "unknown_effects" in schemas["SessionOut"]["required"]
    assert "waiting_reconcile" in schemas["ResolveOut"]["properties"]["status"]["enum"]


def test_every_ledger_state_is_in_the_api_schema() -> None:
    """The listing's schema knows every state the ledger has (superseded
    included): an attempt in a state it did not know would be a 500."""
    from sessions_app.api.schemas import EffectState
    from sessions_app.runtime.effects import State

    assert set(EffectState.__args__) == set(State.__args__)  # type: ignore[attr-defined]
