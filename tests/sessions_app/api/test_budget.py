"""A session's budget over the JSON API and the socket: `GET …/budget` reads
the limits, the spend and what is exhausted, `PUT …/budget` replaces the four
limits (all four required, null: no limit) with one budget/updated, and input
for a new turn while a budget is exhausted is held (receipt disposition
"held" with its reason, an input/held event, no turn/start). A refused PUT
appends nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret
from django.test import Client

from sessions_app.actions.shapes import BudgetFrame
from sessions_app.errors import InvalidInput
from sessions_app.sockets.session import SessionConsumer, parse_frame
from tests.helpers import events, kinds
from tests.sessions_app.apiutil import bearer, call, event_count, make_reviewer, token_for
from tests.sessions_app.apiutil import session_url as url

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

NO_LIMITS = {"cost_usd": None, "tokens": None, "steps": None, "turns": None}
LIMITS = {"cost_usd": 1.5, "tokens": 20000, "steps": 30, "turns": 4}


def budget_url(session: Any) -> str:
    return url(session, "/budget")


# ---------------------------------------------------------------- reading and setting


def test_a_new_session_has_no_limits_nothing_spent_and_nothing_exhausted(client, auth, session):
    response = call(client, "GET", budget_url(session), **auth)
    assert response.status_code == 200
    assert response.data == {
        "limit": NO_LIMITS,
        "spent": {
            "cost_usd": 0.0,
            "tokens": 0,
            "steps": 0,
            "turns": 0,
            "unpriced": 0,
            "children": {"cost_usd": 0.0, "tokens": 0},
        },
        "exhausted": None,
    }


def test_put_sets_the_four_limits_with_one_budget_updated_and_answers_like_get(client, auth, session):
    before = event_count()
    response = call(client, "PUT", budget_url(session), LIMITS, **auth)
    assert response.status_code == 200
    assert response.data["limit"] == LIMITS
    assert response.data["exhausted"] is None
    assert event_count() == before + 1
    assert events(session, "budget/updated") == [{**LIMITS, "by": "owner"}]
    assert call(client, "GET", budget_url(session), **auth).data == response.data

    cleared = call(client, "PUT", budget_url(session), NO_LIMITS, **auth)
    assert cleared.status_code == 200 and cleared.data["limit"] == NO_LIMITS


def test_an_exhausted_budget_is_reported_with_its_reason_in_words(client, auth, session):
    response = call(client, "PUT", budget_url(session), {**NO_LIMITS, "turns": 0}, **auth)
    exhausted = response.data["exhausted"]
    assert {k: exhausted[k] for k in ("budget", "scope", "limit", "spent")} == {
        "budget": "turns",
        "scope": "session",
        "limit": 0,
        "spent": 0,
    }
    assert "turn budget is exhausted" in exhausted["message"]


def test_get_session_carries_the_budget(client, auth, session):
    call(client, "PUT", budget_url(session), LIMITS, **auth)
    body = call(client, "GET", url(session), **auth).data
    assert body["budget"]["limit"] == LIMITS
    assert body["budget"]["spent"]["turns"] == 0 and body["budget"]["exhausted"] is None


@pytest.mark.parametrize(
    "body",
    [
        {**NO_LIMITS, "cost_usd": -1},
        {**NO_LIMITS, "tokens": -5},
        {**NO_LIMITS, "turns": True},
        {**NO_LIMITS, "tokens": 1.5},
        {**NO_LIMITS, "steps": "3"},
        {**NO_LIMITS, "cost_usd": 10_000_000},
        {**NO_LIMITS, "colour": "red"},
        {"cost_usd": None, "tokens": None, "steps": None},
        {},
        [1, 2],
    ],
    ids=[
        "negative-cost",
        "negative",
        "bool",
        "float-tokens",
        "string",
        "too-much",
        "unknown",
        "missing",
        "empty",
        "list",
    ],
)
def test_bad_budgets_are_refused_and_append_nothing(client, auth, session, body):
    before = event_count()
    response = call(client, "PUT", budget_url(session), body, **auth)
    assert response.status_code == 400
    assert response.data["code"] == "invalid_input"
    assert event_count() == before


# ---------------------------------------------------------------- who may


@pytest.mark.parametrize(
    ("role", "get_status", "put_status"),
    [
        ("anonymous", 401, 401),
        ("stranger", 404, 404),
        ("reviewer", 200, 403),
        ("staff", 200, 200),
        ("owner_cookie_without_csrf", 200, 403),
        ("owner_cookie", 200, 200),
    ],
)
def test_who_may_read_and_set_the_budget(make_user, session, role, get_status, put_status):
    client = Client(enforce_csrf_checks=True)
    headers: dict[str, str] = {}
    if role == "stranger":
        headers = bearer(token_for(make_user("stranger")))
    elif role == "reviewer":
        headers = bearer(token_for(make_reviewer(make_user("reviewer"))))
    elif role == "staff":
        headers = bearer(token_for(make_user("staff", is_staff=True)))
    elif role.startswith("owner_cookie"):
        client.force_login(session.owner)
        if role == "owner_cookie":
            secret = _get_new_csrf_string()
            client.cookies["csrftoken"] = secret
            headers = {"HTTP_X_CSRFTOKEN": _mask_cipher_secret(secret)}
    assert call(client, "GET", budget_url(session), **headers).status_code == get_status
    before = event_count()
    response = call(client, "PUT", budget_url(session), LIMITS, **headers)
    assert response.status_code == put_status
    assert event_count() == before + (1 if put_status == 200 else 0)
    if put_status == 200:
        assert events(session, "budget/updated")[-1]["by"] == ("staff" if role == "staff" else "owner")


# ---------------------------------------------------------------- held input


def test_input_while_a_budget_is_exhausted_is_held_with_its_reason(client, auth, session):
    call(client, "PUT", budget_url(session), {**NO_LIMITS, "turns": 0}, **auth)
    after = session.__class__.objects.get(id=session.id).last_seq
    response = call(client, "POST", url(session, "/inputs"), {"text": "hello", "wake": True}, **auth)
    assert response.status_code == 202
    receipt = response.data
    assert receipt["disposition"] == "held" and receipt["turn_seq"] is None
    assert "turn budget is exhausted" in receipt["held_reason"]
    new = kinds(session, after)
    assert "input/held" in new and "turn/start" not in new
    [held] = events(session, "input/held")
    assert held["source_seq"] == receipt["seq"]
    assert held["reason"]["budget"] == "turns" and held["reason"]["scope"] == "session"


def test_a_receipt_that_is_not_held_has_no_held_reason(client, auth, session):
    response = call(client, "POST", url(session, "/inputs"), {"text": "hello", "wake": False}, **auth)
    assert response.status_code == 202
    assert response.data["disposition"] == "queued" and response.data["held_reason"] is None


# ---------------------------------------------------------------- the socket


def test_the_budget_frame_is_validated_like_the_put():
    frame = parse_frame(json.dumps({"type": "budget", "id": "b1", "limit": LIMITS}), None)
    assert isinstance(frame, BudgetFrame) and frame.limit.model_dump() == LIMITS
    for limit in ({**NO_LIMITS, "tokens": 1.5}, {"turns": 1}, {**NO_LIMITS, "extra": 1}):
        with pytest.raises(InvalidInput) as caught:
            parse_frame(json.dumps({"type": "budget", "id": "b2", "limit": limit}), None)
        assert caught.value.frame_id == "b2"  # type: ignore[attr-defined]


def consumer_of(user: Any, session: Any) -> SessionConsumer:
    consumer = SessionConsumer()
    consumer.sid = session.id
    consumer._current_user = lambda: user  # type: ignore[method-assign]
    return consumer


def test_the_budget_frame_sets_the_budget_and_replies_with_it(session):
    frame = parse_frame(json.dumps({"type": "budget", "limit": {**NO_LIMITS, "steps": 7}}), None)
    result = consumer_of(session.owner, session)._perform(frame)
    assert result["budget"]["limit"] == {**NO_LIMITS, "steps": 7}
    assert events(session, "budget/updated") == [{**NO_LIMITS, "steps": 7, "by": "owner"}]


def test_a_reviewer_may_not_set_the_budget_over_the_socket(make_user, session):
    frame = parse_frame(json.dumps({"type": "budget", "limit": LIMITS}), None)
    before = event_count()
    with pytest.raises(Exception) as caught:
        consumer_of(make_reviewer(make_user("reviewer")), session)._perform(frame)
    assert getattr(caught.value, "status", None) == 403
    assert event_count() == before


def test_the_hello_frame_carries_the_budget(session):
    from sessions_app import actions as ops

    consumer = consumer_of(session.owner, session)
    consumer.last_sent = 0
    state = {**ops.live_state(session.id), "budget": ops.budget_state(session.id).as_json()}
    access = {"session": session.id, "can_drive": True, "can_approve": False}
    hello = json.loads(consumer.hello_frame(access, state))
    assert hello["budget"]["limit"] == NO_LIMITS and hello["budget"]["exhausted"] is None
