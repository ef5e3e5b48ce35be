"""GET /api/sessions (paged, filtered, only what the caller may read); JSON
for every answer under /api/ whatever the method or path; the browsable
docs at /api/docs served from local static files."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from sessions_app import log
from sessions_app.models import Session
from sessions_app.services.sessions import archive_session
from tests.sessions_app.apiutil import (
    bearer,
    block_turn,
    call,
    event_count,
    make_reviewer,
    new_session,
    park_calls,
    token_for,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


def ids(response: Any) -> list[str]:
    return [s["id"] for s in response.data["sessions"]]


def test_lists_own_sessions_newest_first_with_their_facts(client: Client, owner: Any, make_user: Any) -> None:
    older, newer = new_session(owner), new_session(owner)
    new_session(make_user("someone-else"))
    Session.objects.filter(id=newer.id).update(title="Newer one")
    response = call(client, "GET", "/api/sessions", **bearer(token_for(owner)))
    assert response.status_code == 200
    assert ids(response) == [str(newer.id), str(older.id)] and response.data["next_cursor"] is None
    first = response.data["sessions"][0]
    assert first["title"] == "Newer one" and first["status"] == "idle" and first["archived"] is False
    assert set(first) == {
        "id", "profile", "title", "status", "created_at", "last_event_at", "last_seq",
        "pending_approvals", "archived", "cost",
    }  # fmt: skip


def test_pages_follow_the_cursor_without_repeats_or_gaps(client: Client, owner: Any) -> None:
    made = [new_session(owner) for _ in range(7)]
    auth = bearer(token_for(owner))
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        query = "/api/sessions?limit=3" + (f"&cursor={cursor}" if cursor else "")
        response = call(client, "GET", query, **auth)
        assert response.status_code == 200
        seen += ids(response)
        pages += 1
        # Work going on meanwhile does not move sessions between pages.
        log.append(made[0].id, "user/message", {"text": "still busy"})
        cursor = response.data["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and seen == [str(s.id) for s in reversed(made)]


def test_filters_status_and_archived(client: Client, owner: Any) -> None:
    idle, waiting, blocked, archived = (new_session(owner) for _ in range(4))
    park_calls(waiting.id, "c1")
    block_turn(blocked.id)
    archive_session(archived.id, by=owner.username)
    auth = bearer(token_for(owner))
    assert ids(call(client, "GET", "/api/sessions?status=waiting_approval", **auth)) == [str(waiting.id)]
    assert ids(call(client, "GET", "/api/sessions?status=blocked", **auth)) == [str(blocked.id)]
    assert ids(call(client, "GET", "/api/sessions?status=idle", **auth)) == [str(idle.id)]
    assert str(archived.id) not in ids(call(client, "GET", "/api/sessions", **auth))
    only = call(client, "GET", "/api/sessions?archived=true", **auth)
    assert ids(only) == [str(archived.id)] and only.data["sessions"][0]["archived"] is True
    assert len(ids(call(client, "GET", "/api/sessions?archived=all", **auth))) == 4


def test_reviewers_and_staff_see_every_session(client: Client, owner: Any, make_user: Any) -> None:
    mine, theirs = new_session(owner), new_session(make_user("bob"))
    reviewer = make_reviewer(make_user("rev"))
    listed = ids(call(client, "GET", "/api/sessions", **bearer(token_for(reviewer))))
    assert {str(mine.id), str(theirs.id)} <= set(listed)


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=201",
        "limit=x",
        "status=sleeping",
        "archived=maybe",
        "cursor=not-a-cursor",
        "cursor=" + "A" * 8,
    ],
)
def test_bad_parameters_are_400(client: Client, owner: Any, query: str) -> None:
    response = call(client, "GET", f"/api/sessions?{query}", **bearer(token_for(owner)))
    assert response.status_code == 400 and response.data["code"] == "invalid_input"


def test_anonymous_is_401_json(client: Client) -> None:
    response = call(client, "GET", "/api/sessions")
    assert response.status_code == 401 and response.data["code"] == "unauthenticated"


# ---------------------------------------------------------------- JSON whatever the method and path


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_unknown_paths_answer_json_404_for_every_method_with_a_token(client: Client, owner: Any, method: str) -> None:
    before = event_count()
    body = None if method == "GET" else {"x": 1}
    response = call(client, method, "/api/no/such/path", body, **bearer(token_for(owner)))
    assert response.status_code == 404 and response.data["code"] == "not_found"
    assert event_count() == before


@pytest.mark.parametrize(
    ("path", "status", "code"), [("/api/no/such/path", 404, "not_found"), ("/api/sessions", 403, "csrf_failed")]
)
def test_a_cookie_post_without_the_csrf_token_is_json(owner: Any, path: str, status: int, code: str) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    before = event_count()
    response = call(browser, "POST", path, {"profile": "demo"})
    assert response.status_code == status and response.data["code"] == code
    assert event_count() == before


@pytest.mark.parametrize(("method", "path"), [("DELETE", "/api/sessions"), ("PUT", "/api/profiles")])
def test_a_method_a_path_does_not_take_is_json_405(client: Client, owner: Any, method: str, path: str) -> None:
    response = call(client, method, path, {}, **bearer(token_for(owner)))
    assert response.status_code == 405 and response.data["code"] == "method_not_allowed"
    assert "GET" in response["Allow"]


def test_pages_outside_the_api_keep_their_html(client: Client) -> None:
    response = client.get("/no/such/page/")
    assert response.status_code == 404 and not response.get("Content-Type", "").startswith("application/json")


# ---------------------------------------------------------------- docs


def test_api_docs_are_served_with_local_assets_only(client: Client) -> None:
    response = client.get("/api/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html and "/api/openapi.json" in html
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources and all(s.startswith("/static/") for s in sources), sources
    # daphne serves /static/ from the finders (terret_site/asgi.py): each asset must be found locally.
    for asset in sources:
        assert finders.find(asset.removeprefix("/static/")), asset


def test_the_openapi_document_has_the_list_and_the_edit_fields(client: Client) -> None:
    doc = client.get("/api/openapi.json").json()
    listed = doc["paths"]["/api/sessions"]["get"]
    assert {p["name"] for p in listed["parameters"]} == {"limit", "cursor", "status", "archived"}
    decision = doc["components"]["schemas"]["DecisionIn"]["properties"]
    assert {"edited_args", "allow_for_session"} <= set(decision)
