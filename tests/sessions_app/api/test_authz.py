"""How a JSON API caller authenticates, on every endpoint: the cookie of a
signed-in user with CSRF, a deactivated user's token, a revoked token, and
the cookie without CSRF. Who may do what is the access table's
(tests/sessions_app/actions/test_access_matrix.py). A refused request
appends nothing."""

from __future__ import annotations

import pytest
from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret
from django.test import Client

from sessions_app.models import ApiToken, Session
from sessions_app.services import tokens
from tests.sessions_app.apiutil import (
    bearer,
    call,
    event_count,
    make_reviewer,
    new_session,
    park_calls,
    token_for,
)

pytestmark = pytest.mark.django_db

ROLES = ["anonymous", "owner", "owner_cookie", "stranger", "staff", "reviewer", "revoked", "inactive"]

# endpoint -> (method, path, body, status by role)
OK_VIEW = {"owner": 200, "owner_cookie": 200, "stranger": 404, "staff": 200, "reviewer": 200}
OK_DRIVE = {"owner": 200, "owner_cookie": 200, "stranger": 404, "staff": 200, "reviewer": 403}
ENDPOINTS = {
    "profiles": ("GET", "/api/profiles", None, {**OK_VIEW, "stranger": 200}),
    "create": ("POST", "/api/sessions", {"profile": "demo"}, {r: 201 for r in OK_VIEW}),
    "detail": ("GET", "/api/sessions/{sid}", None, OK_VIEW),
    "events": ("GET", "/api/sessions/{sid}/events?after=0", None, OK_VIEW),
    "inputs": (
        "POST",
        "/api/sessions/{sid}/inputs",
        {"text": "hi", "wake": False},
        {**OK_DRIVE, "owner": 202, "owner_cookie": 202, "staff": 202},
    ),
    "approve": (
        "POST",
        "/api/sessions/{sid}/approvals/c1",
        {"verdict": "approve"},
        {"owner": 403, "owner_cookie": 403, "stranger": 404, "staff": 403, "reviewer": 200},
    ),
    "deny": (
        "POST",
        "/api/sessions/{sid}/approvals/c1",
        {"verdict": "deny", "reason": "no"},
        {"owner": 403, "owner_cookie": 403, "stranger": 404, "staff": 403, "reviewer": 200},
    ),
    "policy": ("PUT", "/api/sessions/{sid}/policy", {"patterns": ["clock.*"]}, OK_DRIVE),
    "cancel": ("POST", "/api/sessions/{sid}/cancel", None, OK_DRIVE),
    "compact": ("POST", "/api/sessions/{sid}/compact", None, OK_DRIVE),
}
CODES = {401: "unauthenticated", 403: "not_allowed", 404: "unknown_session"}


@pytest.fixture
def world(make_user, settings):
    settings.TERRET_WORKER = "manual"
    owner = make_user("owner")
    session = new_session(owner)
    park_calls(session.id, "c1")  # an open turn with a call waiting, so every action has something to act on
    return {"owner": owner, "session": session}


def client_for(role: str, world, make_user) -> tuple[Client, dict[str, str]]:
    client = Client(enforce_csrf_checks=True)
    if role == "anonymous":
        return client, {}
    if role == "owner":
        return client, bearer(token_for(world["owner"]))
    if role == "owner_cookie":
        client.force_login(world["owner"])
        secret = _get_new_csrf_string()
        client.cookies["csrftoken"] = secret
        return client, {"HTTP_X_CSRFTOKEN": _mask_cipher_secret(secret)}
    if role == "stranger":
        return client, bearer(token_for(make_user("stranger")))
    if role == "staff":
        return client, bearer(token_for(make_user("staff", is_staff=True)))
    if role == "reviewer":
        return client, bearer(token_for(make_reviewer(make_user("reviewer"))))
    if role == "revoked":
        raw = token_for(world["owner"])
        tokens.revoke(ApiToken.objects.filter(prefix=raw[:12]))
        return client, bearer(raw)
    if role == "inactive":
        user = make_user("gone")
        raw = token_for(user)
        user.is_active = False
        user.save()
        return client, bearer(raw)
    raise AssertionError(role)


@pytest.mark.parametrize("role", ["owner_cookie", "inactive", "revoked"])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_the_ways_of_signing_in_that_the_access_table_does_not_list(world, make_user, endpoint, role):
    """The access table (tests/sessions_app/actions/test_access_matrix.py)
    covers every action for every actor by token; here: the signed-in cookie
    with CSRF answers as the owner's token does, and a deactivated user's token
    is refused like a revoked one, on every endpoint."""
    method, path, body, expected = ENDPOINTS[endpoint]
    want = expected.get(role, 401)
    client, headers = client_for(role, world, make_user)
    sessions, events = Session.objects.count(), event_count()
    response = call(client, method, path.format(sid=world["session"].id), body, **headers)
    assert response.status_code == want, response.content
    if want >= 400:
        assert response.data["code"] == CODES[want]
        assert (Session.objects.count(), event_count()) == (sessions, events)


@pytest.mark.parametrize("endpoint", [e for e in ENDPOINTS if ENDPOINTS[e][0] != "GET"])
def test_cookie_auth_without_csrf_is_refused_on_every_unsafe_endpoint(world, endpoint):
    method, path, body, _ = ENDPOINTS[endpoint]
    client = Client(enforce_csrf_checks=True)
    client.force_login(world["owner"])
    sessions, events = Session.objects.count(), event_count()
    response = call(client, method, path.format(sid=world["session"].id), body)
    assert response.status_code == 403 and response.data["code"] == "csrf_failed"
    assert (Session.objects.count(), event_count()) == (sessions, events)
