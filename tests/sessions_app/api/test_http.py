"""The JSON API: each endpoint's behaviour, and bad input that appends nothing."""

from __future__ import annotations

import uuid

import pytest
from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret
from django.test import Client

from sessions_app import log, services
from sessions_app.models import InputReceipt, Session
from tests.fakes.fake_llm import Reply
from tests.sessions_app.apiutil import (
    bearer,
    call,
    event_count,
    head,
    make_reviewer,
    park_calls,
    token_for,
)
from tests.sessions_app.apiutil import (
    session_url as url,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


# ---------------------------------------------------------------- schema and routing


def test_openapi_document_is_served_without_auth_and_lists_every_path(client):
    response = client.get("/api/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/api/profiles",
        "/api/sessions/{session_id}/monitors",
        "/api/monitors/{monitor_id}",
        "/api/monitors/{monitor_id}/editions",
        "/api/monitors/{monitor_id}/editions/{edition_id}/resolve",
        "/api/profiles/{name}/versions",
        "/api/sessions",
        "/api/sessions/{session_id}",
        "/api/sessions/{session_id}/upgrade",
        "/api/sessions/{session_id}/inputs",
        "/api/sessions/{session_id}/inputs/{seq}",
        "/api/sessions/{session_id}/inputs/{seq}/withdraw",
        "/api/sessions/{session_id}/schedules",
        "/api/sessions/{session_id}/schedules/{schedule_id}",
        "/api/sessions/{session_id}/tasks",
        "/api/tasks/{task_id}",
        "/api/tasks/{task_id}/cancel",
        "/api/sessions/{session_id}/events",
        "/api/sessions/{session_id}/approvals/{call_id}",
        "/api/sessions/{session_id}/policy",
        "/api/sessions/{session_id}/cancel",
        "/api/sessions/{session_id}/retry",
        "/api/sessions/{session_id}/compact",
        "/api/sessions/{session_id}/fork",
        "/api/sessions/{session_id}/effects",
        "/api/sessions/{session_id}/effects/{call_id}/resolve",
        "/api/sessions/{session_id}/budget",
        "/api/sessions/{session_id}/storage",
        "/api/sessions/{session_id}/abandon",
        "/api/sessions/{session_id}/revoke",
        "/api/sessions/{session_id}/restore",
        "/api/sessions/{session_id}/documents",
        "/api/sessions/{session_id}/documents/{name}",
        "/api/ops/attention",
        "/api/ops/suspend",
        "/api/ops/resume",
        "/api/me/notifications",
    }
    assert doc["components"]["securitySchemes"]["BearerAuth"] == {"type": "http", "scheme": "bearer"}


def test_unknown_api_paths_answer_json_404(client, auth):
    response = call(client, "GET", "/api/nothing/here", **auth)
    assert response.status_code == 404
    assert response.data["code"] == "not_found"


# ---------------------------------------------------------------- profiles and sessions


def test_profiles_lists_the_demo_profile(client, auth):
    response = call(client, "GET", "/api/profiles", **auth)
    assert response.status_code == 200
    assert "demo" in [p["name"] for p in response.data["profiles"]]


def test_create_session_returns_201_with_id_profile_status(client, auth, owner):
    response = call(client, "POST", "/api/sessions", {"profile": "demo"}, **auth)
    assert response.status_code == 201
    body = response.data
    assert set(body) == {"id", "profile", "status"}
    assert body["profile"] == "demo" and body["status"] == "idle"
    session = Session.objects.get(id=body["id"])
    assert session.owner == owner
    assert session.events.count() == 0  # its agent is spawned by its first input (runtime/registry.py)


@pytest.mark.parametrize(
    "body",
    [{"profile": "no-such-profile"}, {}, {"profile": 5}, {"profile": "demo", "extra": 1}, {"profile": ""}, ["demo"]],
)
def test_create_session_rejects_bad_input_and_creates_nothing(client, auth, body):
    before = Session.objects.count()
    response = call(client, "POST", "/api/sessions", body, **auth)
    assert response.status_code == 400
    assert response.data["code"] == "invalid_input"
    assert Session.objects.count() == before


def test_session_detail_has_status_title_usage_head_and_pending_calls(client, auth, session):
    park_calls(session.id, "c1")
    response = call(client, "GET", url(session), **auth)
    assert response.status_code == 200
    body = response.data
    assert body["id"] == str(session.id)
    assert body["profile"] == "demo"
    assert body["status"] == "waiting_approval"
    assert body["title"] == ""
    assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0, "steps": 0, "unpriced": 0}
    assert body["last_seq"] == head(session.id)
    [pending] = body["pending_approvals"]
    assert pending["call_id"] == "c1" and pending["name"] == "workspace.write"
    assert pending["args"] == {"path": "c1.txt", "text": "x"}


def test_session_detail_reports_usage_totals(client, auth, session):
    log.append(session.id, "turn/start", {})
    log.append(
        session.id, "step/end", {"step": 1, "usage": {"prompt_tokens": 100, "completion_tokens": 7, "cost": 0.25}}
    )
    log.append(session.id, "session/titled", {"title": "Clock talk"})
    body = call(client, "GET", url(session), **auth).data
    assert body["title"] == "Clock talk"
    assert body["usage"]["prompt_tokens"] == 100 and body["usage"]["completion_tokens"] == 7
    assert body["usage"]["cost"] == pytest.approx(0.25) and body["usage"]["steps"] == 1


@pytest.mark.parametrize("sid", [uuid.uuid4(), "not-a-uuid"])
def test_unknown_or_malformed_session_ids_are_404(client, auth, sid):
    response = call(client, "GET", f"/api/sessions/{sid}", **auth)
    assert response.status_code == 404
    assert response.data["code"] == "unknown_session"


# ---------------------------------------------------------------- inputs


def test_input_on_idle_agent_starts_a_turn(client, auth, session):
    response = call(client, "POST", url(session, "/inputs"), {"text": "hello", "wake": True}, **auth)
    assert response.status_code == 202
    receipt = response.data
    assert receipt["disposition"] == "started" and receipt["replayed"] is False
    kinds = list(session.events.filter(seq__gte=receipt["turn_seq"]).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["turn/start", "user/message"]


def test_wake_defaults_to_true(client, auth, session):
    assert call(client, "POST", url(session, "/inputs"), {"text": "hi"}, **auth).data["disposition"] == "started"


def test_input_while_a_turn_runs_is_queued_for_it(client, auth, session):
    first = call(client, "POST", url(session, "/inputs"), {"text": "one"}, **auth).data
    second = call(client, "POST", url(session, "/inputs"), {"text": "two"}, **auth).data
    assert second["disposition"] == "queued"
    assert second["turn_seq"] == first["turn_seq"]
    assert session.events.get(seq=second["seq"]).kind == "input/queued"


def test_idempotency_key_same_payload_returns_the_original_receipt(client, auth, session):
    headers = {**auth, "HTTP_IDEMPOTENCY_KEY": "retry-1"}
    first = call(client, "POST", url(session, "/inputs"), {"text": "hello"}, **headers)
    before = head(session.id)
    again = call(client, "POST", url(session, "/inputs"), {"text": "hello"}, **headers)
    assert again.status_code == 202
    assert again.data == {**first.data, "replayed": True}
    assert head(session.id) == before
    assert InputReceipt.objects.filter(session=session, key="retry-1").count() == 1


def test_idempotency_key_with_other_payload_is_409_and_appends_nothing(client, auth, session):
    headers = {**auth, "HTTP_IDEMPOTENCY_KEY": "retry-2"}
    call(client, "POST", url(session, "/inputs"), {"text": "hello"}, **headers)
    before = head(session.id)
    response = call(client, "POST", url(session, "/inputs"), {"text": "goodbye"}, **headers)
    assert response.status_code == 409
    assert response.data["code"] == "idempotency_conflict"
    assert head(session.id) == before


@pytest.mark.parametrize(
    ("body", "raw", "code"),
    [
        ({"text": ""}, None, "invalid_input"),
        ({"text": "   "}, None, "invalid_input"),
        ({"text": 5}, None, "invalid_input"),
        ({"text": "hi", "wake": "true"}, None, "invalid_input"),
        ({"text": "hi", "wake": 1}, None, "invalid_input"),
        ({"wake": True}, None, "invalid_input"),
        ({"text": "hi", "surprise": 1}, None, "invalid_input"),
        ({"text": "x" * 100_001}, None, "invalid_input"),
        (None, "{not json", "invalid_json"),
        (None, "", "invalid_input"),
        (None, '["hi"]', "invalid_input"),
        (None, '"hi"', "invalid_input"),
    ],
)
def test_bad_inputs_are_400_and_append_nothing(client, auth, session, body, raw, code):
    before = event_count()
    response = call(client, "POST", url(session, "/inputs"), body, raw=raw, **auth)
    assert response.status_code == 400, response.content
    assert response.data["code"] == code
    assert event_count() == before


@pytest.mark.parametrize("key", ["", "k" * 201, "has space"])
def test_bad_idempotency_keys_are_400(client, auth, session, key):
    before = event_count()
    response = call(client, "POST", url(session, "/inputs"), {"text": "hi"}, **auth, HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400
    assert event_count() == before


def test_oversized_body_is_413_and_appends_nothing(client, auth, session, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    before = event_count()
    response = call(client, "POST", url(session, "/inputs"), {"text": "x" * 5000}, **auth)
    assert response.status_code == 413
    assert response.data["code"] == "payload_too_large"
    assert event_count() == before


# ---------------------------------------------------------------- events


def test_events_page_by_after_and_limit(client, auth, session):
    for n in range(5):
        call(client, "POST", url(session, "/inputs"), {"text": f"m{n}", "wake": False}, **auth)
    last = head(session.id)
    page = call(client, "GET", url(session, "/events?after=1&limit=2"), **auth).data
    assert [e["seq"] for e in page["events"]] == [2, 3]
    assert page["last_seq"] == last
    event = page["events"][0]
    assert set(event) == {"seq", "kind", "data", "at"}
    assert event["kind"] == "input/queued" and event["data"]["text"] == "m0"
    rest = call(client, "GET", url(session, "/events?after=3&limit=1000"), **auth).data
    assert [e["seq"] for e in rest["events"]] == list(range(4, last + 1))


def test_events_default_reads_from_the_start(client, auth, session):
    page = call(client, "GET", url(session, "/events"), **auth).data
    assert [e["kind"] for e in page["events"]] == ["agent/spawned"]


@pytest.mark.parametrize(
    "query", ["after=-1", "limit=0", "limit=1001", "after=x", "limit=1.5", f"after={2**63}", f"after={10**30}"]
)
def test_bad_event_queries_are_400(client, auth, session, query):
    response = call(client, "GET", url(session, f"/events?{query}"), **auth)
    assert response.status_code == 400
    assert response.data["code"] == "invalid_input"


# ---------------------------------------------------------------- approvals


@pytest.fixture
def reviewer_auth(owner):
    make_reviewer(owner)
    return bearer(token_for(owner))


def test_approve_and_deny_record_verdicts(client, reviewer_auth, session):
    park_calls(session.id, "c1", "c2")
    ok = call(client, "POST", url(session, "/approvals/c1"), {"verdict": "approve", "reason": "fine"}, **reviewer_auth)
    assert ok.status_code == 200
    assert ok.data["call_id"] == "c1" and ok.data["verdict"] == "approve"
    event = session.events.get(seq=ok.data["seq"])
    assert event.kind == "approval/resolved" and event.data["reason"] == "fine"
    no = call(client, "POST", url(session, "/approvals/c2"), {"verdict": "deny"}, **reviewer_auth)
    assert no.status_code == 200 and no.data["verdict"] == "deny"
    detail = call(client, "GET", url(session), **reviewer_auth).data
    assert detail["pending_approvals"] == []


def test_second_verdict_on_a_call_is_409(client, reviewer_auth, session):
    park_calls(session.id, "c1")
    call(client, "POST", url(session, "/approvals/c1"), {"verdict": "approve"}, **reviewer_auth)
    before = head(session.id)
    again = call(client, "POST", url(session, "/approvals/c1"), {"verdict": "deny"}, **reviewer_auth)
    assert again.status_code == 409 and again.data["code"] == "already_decided"
    assert head(session.id) == before


@pytest.mark.parametrize(
    ("call_id", "body", "status", "code"),
    [
        ("nope", {"verdict": "approve"}, 404, "unknown_call"),
        ("c1", {"verdict": "maybe"}, 400, "invalid_input"),
        ("c1", {}, 400, "invalid_input"),
        ("c1", {"verdict": "approve", "reason": 3}, 400, "invalid_input"),
        ("c1", {"verdict": "approve", "request_seq": 0}, 400, "invalid_input"),
        ("c1", {"verdict": "approve", "request_seq": True}, 400, "invalid_input"),
    ],
)
def test_bad_verdicts_append_nothing(client, reviewer_auth, session, call_id, body, status, code):
    park_calls(session.id, "c1")
    before = head(session.id)
    response = call(client, "POST", url(session, f"/approvals/{call_id}"), body, **reviewer_auth)
    assert response.status_code == status
    assert response.data["code"] == code
    assert head(session.id) == before


# ---------------------------------------------------------------- policy, cancel, compact


def test_put_policy_replaces_the_patterns(client, auth, session):
    response = call(client, "PUT", url(session, "/policy"), {"patterns": ["clock.*", "workspace.read"]}, **auth)
    assert response.status_code == 200
    assert response.data["patterns"] == ["clock.*", "workspace.read"]
    assert session.events.get(seq=response.data["seq"]).kind == "policy/updated"


@pytest.mark.parametrize("body", [{"patterns": ["bad pattern"]}, {"patterns": "clock.*"}, {"patterns": [1]}, {}])
def test_bad_policies_are_400_and_append_nothing(client, auth, session, body):
    before = head(session.id)
    response = call(client, "PUT", url(session, "/policy"), body, **auth)
    assert response.status_code == 400
    assert response.data["code"] in {"invalid_input", "invalid_pattern"}
    assert head(session.id) == before


def test_cancel_without_a_turn_says_false_and_appends_nothing(client, auth, session):
    before = head(session.id)
    response = call(client, "POST", url(session, "/cancel"), **auth)
    assert response.status_code == 200 and response.data == {"cancelled": False, "closed": False}
    assert head(session.id) == before


def test_cancel_of_a_turn_no_worker_holds_closes_it_at_once(client, auth, session):
    park_calls(session.id, "c1")
    response = call(client, "POST", url(session, "/cancel"), **auth)
    assert response.data == {"cancelled": True, "closed": True}
    kinds = list(session.events.order_by("-seq").values_list("kind", flat=True)[:4])
    assert kinds == ["turn/end", "tool/result", "approval/resolved", "turn/cancel_requested"]
    end = session.events.order_by("-seq").first()
    assert end.data == {"status": "cancelled", "by": "owner"}
    assert call(client, "GET", url(session), **auth).data["status"] == "idle"


def test_compact_during_a_turn_is_declined_with_a_reason(client, auth, session):
    park_calls(session.id, "c1")
    before = head(session.id)
    response = call(client, "POST", url(session, "/compact"), **auth)
    assert response.status_code == 200
    assert response.data["compacted"] is False and "turn" in response.data["reason"]
    assert head(session.id) == before


def test_compact_summarises_history(client, auth, session, fake_llm):
    log.append(session.id, "user/message", {"text": "remember 42"})
    log.append(session.id, "assistant/message", {"content": "noted"})
    services.set_model(session.id, "compactor", "fake/compactor")
    fake_llm.script(Reply(text="The user asked to remember 42.", usage=(50, 9, 0.01)))
    response = call(client, "POST", url(session, "/compact"), **auth)
    assert response.status_code == 200, response.content
    assert response.data["compacted"] is True
    event = session.events.get(seq=response.data["seq"])
    assert event.kind == "session/compacted" and "42" in event.data["summary"]


# ---------------------------------------------------------------- CSRF


def test_cookie_auth_unsafe_request_needs_csrf(owner, session):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    before = head(session.id)
    refused = call(client, "POST", url(session, "/inputs"), {"text": "hi"})
    assert refused.status_code == 403 and refused.data["code"] == "csrf_failed"
    assert head(session.id) == before
    secret = _get_new_csrf_string()
    client.cookies["csrftoken"] = secret
    accepted = call(
        client, "POST", url(session, "/inputs"), {"text": "hi"}, HTTP_X_CSRFTOKEN=_mask_cipher_secret(secret)
    )
    assert accepted.status_code == 202


def test_cookie_auth_reads_need_no_csrf(owner, session):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert call(client, "GET", url(session)).status_code == 200


def test_bearer_requests_are_csrf_exempt(auth, session):
    client = Client(enforce_csrf_checks=True)
    assert call(client, "POST", url(session, "/inputs"), {"text": "hi"}, **auth).status_code == 202


def test_invalid_bearer_does_not_fall_back_to_the_cookie(client, owner, session):
    client.force_login(owner)
    response = call(client, "GET", url(session), HTTP_AUTHORIZATION="Bearer trt_not-a-real-token")
    assert response.status_code == 401
    assert response.data["code"] == "unauthenticated"
