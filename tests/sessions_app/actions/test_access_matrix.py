"""One access table for every door (issue 28): every action x (owner, another
user, reviewer, staff, anonymous, a revoked token), through every door that
offers it: the pages and forms, the JSON API, the session socket's frames and
/lg/. The table is ONE mapping of action -> need (actions.access); the
answer an actor gets follows from the need alone, so every door must give the
same answer to the same question:

- anonymous or a revoked token: unauthenticated (a page redirects to login);
- another user (and a missing id, for anyone): unknown_session (404);
- readable but not allowed: not_allowed (403);
- allowed: anything but those three (the action may still fail on its own
  terms, e.g. no effect of unknown outcome to resolve).

A refusal changes nothing: no event, session or schedule is written.
This replaces the per-door matrices (approvals' views/API/socket matrix, the
API's and the socket's authorization tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from sessions_app.models import ApiToken, Event, Monitor, Schedule, Session
from sessions_app.runtime import documents
from sessions_app.services import tokens
from tests.sessions_app.apiutil import bearer, call, make_reviewer, new_session, park_calls, token_for
from tests.sessions_app.sockutil import closed_with, db, fresh_channel_layer, open_socket, recv

_ = fresh_channel_layer  # an autouse fixture

ACTORS = ["owner", "other", "reviewer", "staff", "admin", "anonymous", "revoked"]
ACCESS_CODES = {"unauthenticated", "unknown_session", "not_allowed"}

# The one table: each user action and the need it asks of actions.access.
ACTIONS: dict[str, str] = {
    "read": "view",
    "approvals": "view",
    "policy editor": "view",
    "events": "view",
    "documents": "view",
    "document": "view",
    "download document": "view",
    "send": "drive",
    "write document": "drive",
    "cancel": "drive",
    "policy": "drive",
    "budget": "drive",
    "schedule": "drive",
    "monitors": "view",
    "monitor": "drive",
    "decide": "approve",
    "resolve": "resolve",
    "abandon": "operate",
}
MAY: dict[str, set[str]] = {
    "owner": {"view", "drive"},
    "reviewer": {"view", "approve"},
    "staff": {"view", "drive", "resolve", "operate"},
    "admin": {"view", "drive", "approve", "resolve", "operate"},  # a superuser: staff and a reviewer
}


def answer(need: str, actor: str) -> str:
    """What `actor` must get for an action of `need`, on every door."""
    if actor in ("anonymous", "revoked"):
        return "unauthenticated"
    if actor == "other":
        return "unknown_session"
    return "ok" if need in MAY[actor] else "not_allowed"


@pytest.fixture
def world(make_user: Any, settings: Any) -> dict[str, Any]:
    settings.TERRET_WORKER = "manual"
    settings.TERRET_OWNER_MAY_RESOLVE = False
    owner = make_user("owner")
    session = new_session(owner)
    park_calls(session.id, "c1")  # an open turn with a call waiting: every action has something to act on
    documents.write(session.id, "notes/a.txt", b"hi", by="agent")  # a file to read (the files panel's pages)
    revoked = token_for(owner)
    tokens.revoke(ApiToken.objects.filter(prefix=revoked[:12]))
    users = {
        "owner": owner,
        "other": make_user("other"),
        "reviewer": make_reviewer(make_user("reviewer")),
        "staff": make_user("staff", is_staff=True),
        "admin": get_user_model().objects.create_superuser("admin", password="pw"),
        "anonymous": None,
        "revoked": None,
    }
    creds = {name: token_for(user) for name, user in users.items() if user is not None}
    creds["revoked"] = revoked
    return {"sid": session.id, "users": users, "tokens": creds, "seq": session_head(session.id)}


def session_head(sid: Any) -> int:
    return int(Session.objects.get(id=sid).last_seq)


def footprint() -> tuple[int, int, int, int]:
    return Event.objects.count(), Session.objects.count(), Schedule.objects.count(), Monitor.objects.count()


def code_of_json(response: Any) -> str:
    if response.status_code < 400:
        return "ok"
    code = json.loads(response.content)["code"]
    return code if code in ACCESS_CODES else "ok"


def code_of_page(response: Any) -> str:
    if response.status_code == 302 and response["Location"].startswith("/accounts/login/"):
        return "unauthenticated"
    return {404: "unknown_session", 403: "not_allowed"}.get(response.status_code, "ok")


# ---------------------------------------------------------------- the doors

LATER = "2099-01-01T00:00:00+00:00"


def api(method: str, path: str, body: Any = None) -> Callable[[Client, dict[str, str], Any, int], Any]:
    def run(client: Client, headers: dict[str, str], sid: Any, seq: int) -> Any:
        return call(client, method, "/api/sessions/" + str(sid) + path, body, **headers)

    return run


API = {
    "read": api("GET", ""),
    "events": api("GET", "/events?after=0"),
    "send": api("POST", "/inputs", {"text": "hi", "wake": False}),
    "cancel": api("POST", "/cancel"),
    "policy": api("PUT", "/policy", {"patterns": ["clock.*"]}),
    "budget": api("PUT", "/budget", {"cost_usd": None, "tokens": 1000, "steps": None, "turns": None}),
    "schedule": api("POST", "/schedules", {"text": "wake", "due_at": LATER}),
    "monitors": api("GET", "/monitors"),
    # Allowed, it is refused on its own terms (a private feed URL): nothing is made either way.
    "monitor": api(
        "POST",
        "/monitors",
        {
            "schedule": {"every_seconds": 3600},
            "sources": [{"kind": "feed", "url": "http://10.0.0.1/feed"}],
            "destination": {"kind": "session"},
        },
    ),
    "decide": api("POST", "/approvals/c1", {"verdict": "approve"}),
    "resolve": api("POST", "/effects/c1/resolve", {"action": "failed", "result": "no"}),
    "abandon": api("POST", "/abandon", {"reason": "test"}),
    "documents": api("GET", "/documents"),
    "document": api("GET", "/documents/notes/a.txt?version=1"),
    "write document": api("PUT", "/documents/notes/a.txt", {"content": "hi"}),
}


def page(method: str, path: str, form: dict[str, Any] | None = None) -> Callable[[Client, Any, int], Any]:
    def run(client: Client, sid: Any, seq: int) -> Any:
        url = path.format(sid=sid)
        # "SEQ" is the session's head; a callable makes a fresh value per call (an upload's file).
        data = {k: (seq if v == "SEQ" else v() if callable(v) else v) for k, v in (form or {}).items()}
        return client.get(url) if method == "GET" else client.post(url, data)

    return run


PAGES = {
    "read": page("GET", "/sessions/{sid}/"),
    "approvals": page("GET", "/approvals/sessions/{sid}/"),
    "policy editor": page("GET", "/sessions/{sid}/policy/"),
    "events": page("GET", "/sessions/{sid}/context/"),
    "send": page("POST", "/sessions/{sid}/messages/", {"text": "hi"}),
    "cancel": page("POST", "/sessions/{sid}/cancel/"),
    "policy": page("POST", "/sessions/{sid}/policy/", {"patterns": "clock.*"}),
    "budget": page("POST", "/sessions/{sid}/budget/", {"tokens": "1000"}),
    "schedule": page("POST", "/sessions/{sid}/schedules/", {"text": "wake", "due_at": "2099-01-01T00:00"}),
    "decide": page("POST", "/approvals/sessions/{sid}/decide/", {"call_id": "c1", "seq": "SEQ", "verdict": "approve"}),
    "resolve": page("POST", "/sessions/{sid}/effects/resolve/", {"call_id": "c1", "action": "failed"}),
    "abandon": page("POST", "/ops/sessions/{sid}/abandon/", {"reason": "test"}),
    # The chat page's files panel (web/files.py).
    "document": page("GET", "/sessions/{sid}/files/view/notes/a.txt?version=1"),
    "download document": page("GET", "/sessions/{sid}/files/download/notes/a.txt?version=1"),
    "write document": page(
        "POST", "/sessions/{sid}/files/upload/", {"file": lambda: SimpleUploadedFile("a.txt", b"hi"), "name": "notes/"}
    ),
}

LG = {
    "read": ("GET", "/lg/threads/{sid}", None),
    "events": ("GET", "/lg/threads/{sid}/state", None),
    "send": ("POST", "/lg/threads/{sid}/runs", {"input": {"messages": [{"role": "user", "content": "hi"}]}}),
}

# The session socket's frames (sent on one socket per actor, in this order).
FRAMES = {
    "read": {"type": "ping"},
    "send": {"type": "inject", "text": "hi", "wake": False},
    "policy": {"type": "set_policy", "patterns": ["clock.*"]},
    "budget": {"type": "budget", "limit": {"cost_usd": None, "tokens": 1000, "steps": None, "turns": None}},
    "schedule": {"type": "schedule", "schedule": {"text": "wake", "due_at": LATER}},
    "decide": {"type": "approve", "call_id": "c1"},
    "cancel": {"type": "cancel"},
}


def _check(world: dict[str, Any], action: str, actor: str, got: str, before: tuple[int, int, int]) -> None:
    want = answer(ACTIONS[action], actor)
    assert got == want, (action, actor, got)
    if want != "ok":
        assert footprint() == before, f"{action} by {actor} was refused but changed something"


# ---------------------------------------------------------------- pages and forms


@pytest.mark.django_db
@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("action", list(PAGES))
def test_pages(world: dict[str, Any], action: str, actor: str) -> None:
    client = Client()
    user = world["users"][actor]
    if user is not None:
        client.force_login(user)
    before = footprint()
    response = PAGES[action](client, world["sid"], world["seq"])
    _check(world, action, actor, code_of_page(response), before)
    html = response.content.decode() if response.status_code == 200 else ""
    if html and action == "approvals":
        # Whoever sees the waiting call sees the verdict form only if they may decide it.
        assert "workspace.write" in html
        assert ('name="verdict"' in html) is ("approve" in MAY[actor])
    if html and action == "policy editor":
        assert ("<textarea" in html) is ("drive" in MAY[actor])


# ---------------------------------------------------------------- the JSON API


@pytest.mark.django_db
@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("action", list(API))
def test_api(world: dict[str, Any], action: str, actor: str) -> None:
    token = world["tokens"].get(actor)
    headers = bearer(token) if token else {}
    before = footprint()
    response = API[action](Client(), headers, world["sid"], world["seq"])
    _check(world, action, actor, code_of_json(response), before)


# ---------------------------------------------------------------- /lg/


@pytest.mark.django_db
@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("action", list(LG))
def test_lg(world: dict[str, Any], action: str, actor: str) -> None:
    method, path, body = LG[action]
    token = world["tokens"].get(actor)
    headers = {"HTTP_X_API_KEY": token} if token else {}
    before = footprint()
    response = call(Client(), method, path.format(sid=world["sid"]), body, **headers)
    _check(world, action, actor, code_of_json(response), before)


# ---------------------------------------------------------------- the session socket


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("actor", ACTORS)
async def test_socket_frames(world: dict[str, Any], actor: str) -> None:
    token = world["tokens"].get(actor)
    query = f"?token={token}" if token else ""
    comm = await open_socket(f"/ws/sessions/{world['sid']}/{query}", headers=[(b"origin", b"http://localhost")])
    first = await recv(comm)
    if first["type"] == "error":  # let in by no frame: every action answers as the connection did
        for action in FRAMES:
            assert first["code"] == answer(ACTIONS[action], actor), (action, actor, first)
        assert await closed_with(comm) == {"unauthenticated": 4401, "unknown_session": 4404}[first["code"]]
        return
    assert answer("view", actor) == "ok"
    assert first["type"] == "hello"
    assert (first["can_drive"], first["can_approve"]) == ("drive" in MAY[actor], "approve" in MAY[actor])
    for n, (action, frame) in enumerate(FRAMES.items()):
        before = await db(footprint)()
        await comm.send_json_to({**frame, "id": n})
        reply = await recv(comm)
        while reply.get("id") != n:  # events and deltas of what the frames did
            reply = await recv(comm)
        got = "ok" if reply["type"] == "ack" or reply["code"] not in ACCESS_CODES else reply["code"]
        want = answer(ACTIONS[action], actor)
        assert got == want, (action, actor, reply)
        if want != "ok":
            assert await db(footprint)() == before
    await comm.disconnect()


# ---------------------------------------------------------------- a missing id is a foreign id


MISSING = "00000000-0000-4000-8000-000000000000"


@pytest.mark.django_db
@pytest.mark.parametrize("action", list(ACTIONS))
def test_a_missing_session_answers_like_a_foreign_one_on_every_door(world: dict[str, Any], action: str) -> None:
    staff = world["users"]["staff"]  # reads every session
    before = footprint()
    api_client = Client()
    got = (
        code_of_json(API[action](api_client, bearer(world["tokens"]["staff"]), MISSING, 1))
        if action in API
        else "unknown_session"
    )
    page_client = Client()
    page_client.force_login(staff)
    got_page = code_of_page(PAGES[action](page_client, MISSING, 1)) if action in PAGES else "unknown_session"
    assert (got, got_page) == ("unknown_session", "unknown_session"), action
    if action in LG:
        method, path, body = LG[action]
        response = call(Client(), method, path.format(sid=MISSING), body, HTTP_X_API_KEY=world["tokens"]["staff"])
        assert code_of_json(response) == "unknown_session"
    assert footprint() == before
