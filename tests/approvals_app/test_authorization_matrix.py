"""Who may do what, for every approval and policy action, through every door:
the HTML views, the JSON API and socket frames.

Actors: anonymous, the session's owner, another user, a reviewer (the
"reviewers" group), an admin (superuser) and plain staff (sees everything,
is no reviewer). Every refused action must append nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.services.tokens import issue_token
from tests.approvals_app.conftest import park

ACTORS = ["anonymous", "owner", "other", "reviewer", "admin", "staff"]


@pytest.fixture
def world(make_user: Any, make_reviewer: Any, profile: AgentProfile, settings: Any) -> dict[str, Any]:
    settings.TERRET_WORKER = "manual"
    users = {
        "anonymous": None,
        "owner": make_user("owner"),
        "other": make_user("other"),
        "reviewer": make_reviewer("reviewer"),
        "admin": get_user_model().objects.create_superuser("admin", password="pw"),
        "staff": make_user("staff", is_staff=True),
    }
    session = services.create_session(users["owner"], profile)
    seq = park(session.id, "c1")
    return {"users": users, "session": session, "seq": seq}


def appended(session: Session, since: int) -> list[str]:
    return list(Event.objects.filter(session=session, seq__gt=since).values_list("kind", flat=True))


def head(session: Session) -> int:
    return Session.objects.get(id=session.id).last_seq


# ---------------------------------------------------------------- views

# status codes; "+" marks an action that succeeds and appends its event.
VIEWS: dict[str, dict[str, str]] = {
    "queue page": dict(anonymous="302", owner="403", other="403", reviewer="200", admin="200", staff="403"),
    "queue fragment": dict(anonymous="302", owner="403", other="403", reviewer="200", admin="200", staff="403"),
    "inline partial": dict(anonymous="302", owner="200", other="404", reviewer="200", admin="200", staff="200"),
    "decide": dict(anonymous="302", owner="403", other="403", reviewer="302+", admin="302+", staff="403"),
    "policy editor": dict(anonymous="302", owner="200", other="404", reviewer="200", admin="200", staff="200"),
    "policy save": dict(anonymous="302", owner="302+", other="404", reviewer="403", admin="302+", staff="302+"),
}


def _view_request(client: Client, action: str, session: Session, seq: int) -> Any:
    sid = session.id
    if action == "queue page":
        return client.get("/approvals/")
    if action == "queue fragment":
        return client.get("/approvals/queue/")
    if action == "inline partial":
        return client.get(f"/approvals/sessions/{sid}/")
    if action == "decide":
        return client.post(f"/approvals/sessions/{sid}/decide/", {"call_id": "c1", "seq": seq, "verdict": "approve"})
    if action == "policy editor":
        return client.get(f"/sessions/{sid}/policy/")
    if action == "policy save":
        return client.post(f"/sessions/{sid}/policy/", {"patterns": "clock.*"})
    raise AssertionError(action)


@pytest.mark.django_db
@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("action", list(VIEWS))
def test_views(world: dict[str, Any], action: str, actor: str) -> None:
    session, user = world["session"], world["users"][actor]
    client = Client()
    if user is not None:
        client.force_login(user)
    before = head(session)
    response = _view_request(client, action, session, world["seq"])
    expected = VIEWS[action][actor]
    assert str(response.status_code) == expected.rstrip("+"), (action, actor, response.status_code)
    if actor == "anonymous":
        assert response["Location"].startswith("/accounts/login/")
    new = appended(session, before)
    if expected.endswith("+"):
        assert new == ["approval/resolved" if action == "decide" else "policy/updated"]
    else:
        assert new == []
    html = response.content.decode() if response.status_code == 200 else ""
    if html and action in ("queue page", "queue fragment", "inline partial"):
        # Whoever sees the call sees the form only if they may decide it.
        assert "workspace.write" in html
        assert ('name="verdict"' in html) is (actor in ("reviewer", "admin"))
    if html and action == "policy editor":
        assert ("<textarea" in html) is (actor in ("owner", "admin", "staff"))


# ---------------------------------------------------------------- JSON API

API: dict[str, dict[str, str]] = {
    "session detail (pending calls)": dict(
        anonymous="401", owner="200", other="404", reviewer="200", admin="200", staff="200"
    ),
    "decide": dict(anonymous="401", owner="403", other="404", reviewer="200+", admin="200+", staff="403"),
    "set policy": dict(anonymous="401", owner="200+", other="404", reviewer="403", admin="200+", staff="200+"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("action", list(API))
def test_api(world: dict[str, Any], action: str, actor: str) -> None:
    session, user = world["session"], world["users"][actor]
    headers = {} if user is None else {"HTTP_AUTHORIZATION": f"Bearer {issue_token(user)[1]}"}
    client = Client()
    sid = session.id
    before = head(session)
    if action == "decide":
        body = {"verdict": "approve", "request_seq": world["seq"]}
        response = client.post(f"/api/sessions/{sid}/approvals/c1", json.dumps(body), "application/json", **headers)
    elif action == "set policy":
        body = {"patterns": ["clock.*"]}
        response = client.put(f"/api/sessions/{sid}/policy", json.dumps(body), "application/json", **headers)
    else:
        response = client.get(f"/api/sessions/{sid}", **headers)
    expected = API[action][actor]
    assert str(response.status_code) == expected.rstrip("+"), (action, actor, response.content)
    new = appended(session, before)
    if expected.endswith("+"):
        assert new == ["approval/resolved" if action == "decide" else "policy/updated"]
    else:
        assert new == []
    if response.status_code >= 400:
        assert response.json()["code"] in {"unauthenticated", "not_allowed", "unknown_session"}
    elif action.startswith("session detail"):
        assert [p["call_id"] for p in response.json()["pending_approvals"]] == ["c1"]


# ---------------------------------------------------------------- sockets

# Session socket: how the connection ends up, then the reply to each frame.
SOCKET: dict[str, dict[str, str]] = {
    "connect": dict(anonymous="4401", owner="ok", other="4404", reviewer="ok", admin="ok", staff="ok"),
    "approve": dict(anonymous="-", owner="not_allowed", other="-", reviewer="ack+", admin="ack+", staff="not_allowed"),
    "set_policy": dict(anonymous="-", owner="ack+", other="-", reviewer="not_allowed", admin="ack+", staff="ack+"),
}


def _application() -> Any:
    from terret_site.asgi import application

    return application


def _path(base: str, user: Any) -> str:
    return base if user is None else f"{base}?token={issue_token(user)[1]}"


async def _next_frame(comm: WebsocketCommunicator, want: str, wait: float = 10.0) -> dict[str, Any]:
    """The next frame of type `want` (or an error), skipping event frames."""
    while True:
        raw = await comm.receive_output(wait)
        if raw["type"] == "websocket.close":
            return {"type": "close", "code": raw.get("code")}
        frame = json.loads(raw["text"])
        if frame.get("type") in (want, "error"):
            return frame


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("actor", ACTORS)
async def test_session_socket_frames(world: dict[str, Any], actor: str) -> None:
    session, user = world["session"], world["users"][actor]
    path = await sync_to_async(_path)(f"/ws/sessions/{session.id}/", user)
    comm = WebsocketCommunicator(_application(), path, headers=[(b"origin", b"http://localhost")])
    connected, _ = await comm.connect()
    assert connected
    first = await _next_frame(comm, "hello")
    if SOCKET["connect"][actor] != "ok":
        assert first["type"] == "error"
        closing = await comm.receive_output(10)
        assert closing == {"type": "websocket.close", "code": int(SOCKET["connect"][actor])}
        return
    assert first["type"] == "hello"
    for n, frame in enumerate(
        [
            {"type": "approve", "id": 1, "call_id": "c1", "request_seq": world["seq"]},
            {"type": "set_policy", "id": 2, "patterns": ["clock.*"]},
        ]
    ):
        before = await sync_to_async(head)(session)
        await comm.send_to(text_data=json.dumps(frame))
        reply = await _next_frame(comm, "ack")
        expected = SOCKET[frame["type"]][actor]
        if expected.startswith("ack"):
            assert reply["type"] == "ack" and reply["id"] == frame["id"], reply
        else:
            assert reply["type"] == "error" and reply["code"] == expected, reply
        new = await sync_to_async(appended)(session, before)
        kind = "approval/resolved" if frame["type"] == "approve" else "policy/updated"
        assert new == ([kind] if expected.endswith("+") else []), (frame["type"], actor, new)
    await comm.disconnect()


APPROVALS_SOCKET = dict(anonymous="4401", owner="4403", other="4403", reviewer="ok", admin="ok", staff="4403")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("actor", ACTORS)
async def test_approvals_socket(world: dict[str, Any], actor: str) -> None:
    session, user = world["session"], world["users"][actor]
    path = await sync_to_async(_path)("/ws/approvals/", user)
    comm = WebsocketCommunicator(_application(), path, headers=[(b"origin", b"http://localhost")])
    connected, _ = await comm.connect()
    assert connected
    expected = APPROVALS_SOCKET[actor]
    if expected != "ok":
        refusal = json.loads((await comm.receive_output(10))["text"])
        assert refusal["type"] == "error"
        assert await comm.receive_output(10) == {"type": "websocket.close", "code": int(expected)}
        return
    # A client frame is answered (this socket takes no commands), never acted on.
    before = await sync_to_async(head)(session)
    await comm.send_to(text_data=json.dumps({"type": "approve", "call_id": "c1"}))
    reply = json.loads(await comm.receive_from(10))
    assert reply["type"] == "error" and reply["code"] == "not_allowed"
    assert await sync_to_async(appended)(session, before) == []
    await comm.disconnect()
