"""The fork through every door: POST
/api/sessions/{id}/fork and the session socket's `fork` frame (docs/protocol.md).
The parent's log is written by real appends in the shapes the runtime writes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from sessions_app import log
from sessions_app.log.projection import derive_messages
from sessions_app.models import Event, Session
from tests.sessions_app.apiutil import bearer, make_reviewer, session_url, token_for
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket, recv_until, send, synced

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer  # an autouse fixture

CALL = {"id": "call_1", "name": "clock.now", "arguments": "{}"}


def one_turn(session: Session) -> dict[str, int]:
    """A completed tool-calling turn; the seqs of its step boundary and its end."""
    sid = session.id
    log.append_many(sid, [("turn/start", {}), ("user/message", {"text": "what time is it?"})])
    log.append(sid, "step/start", {"step": 1, "model": "demo/offline"})
    log.append(sid, "assistant/message", {"content": None, "tool_calls": [CALL]})
    log.append(sid, "tool/result", {"call_id": "call_1", "name": "clock.now", "content": "10:42"})
    step_end = log.append(sid, "step/end", {"step": 1}).seq
    log.append(sid, "step/start", {"step": 2, "model": "demo/offline"})
    log.append(sid, "assistant/message", {"content": "It is 10:42."})
    log.append(sid, "step/end", {"step": 2})
    end = log.append(sid, "turn/end", {"status": "completed"}).seq
    return {"step_end": step_end, "end": end}


def post_fork(client: Client, session: Session, body: Any, headers: dict[str, Any]) -> Any:
    return client.post(session_url(session, "/fork"), data=json.dumps(body), content_type="application/json", **headers)


def head(session: Session) -> int:
    return int(Session.objects.values_list("last_seq", flat=True).get(id=session.id))


def test_fork_returns_the_new_session(client: Client, session: Session, auth: dict[str, Any], owner: Any) -> None:
    seqs = one_turn(session)
    response = post_fork(client, session, {"at_seq": seqs["step_end"], "policy": "historical"}, auth)
    assert response.status_code == 201, response.content
    body = response.json()
    child = Session.objects.get(id=body["id"])
    assert body == {
        "id": str(child.id),
        "profile": "demo",
        "status": "idle",
        "parent": str(session.id),
        "at_seq": seqs["step_end"],
        "requested_seq": None,
        "policy": "historical",
        "last_seq": child.last_seq,
    }
    assert child.owner_id == owner.pk
    assert derive_messages(child.id) == derive_messages(session.id, until_seq=seqs["step_end"])
    # the fork reads back through the same API
    detail = client.get(f"/api/sessions/{child.id}", **auth).json()
    assert detail["status"] == "idle" and detail["last_seq"] == child.last_seq


def test_refused_fork_point_is_422_and_names_the_nearest(
    client: Client, session: Session, auth: dict[str, str]
) -> None:
    seqs = one_turn(session)
    before, sessions = head(session), Session.objects.count()
    inside = seqs["step_end"] - 1  # the tool/result inside step 1
    response = post_fork(client, session, {"at_seq": inside, "policy": "current"}, auth)
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_fork_point"
    start = seqs["step_end"] - 3
    assert (body["before"], body["after"]) == (start - 1, seqs["step_end"])
    assert f"fork at {start - 1} (before the step) or {seqs['step_end']} (after it)" in body["message"]
    past = post_fork(client, session, {"at_seq": before + 1, "policy": "fresh"}, auth).json()
    assert past["code"] == "invalid_fork_point" and past["before"] == before and past["after"] is None
    assert head(session) == before and Session.objects.count() == sessions


@pytest.mark.parametrize(
    "body",
    [
        {"at_seq": 1, "policy": "sideways"},
        {"at_seq": "one", "policy": "fresh"},
        {"policy": "fresh"},
        {"at_seq": 1, "policy": "fresh", "extra": True},
    ],
)
def test_bad_bodies_are_400(client: Client, session: Session, auth: dict[str, str], body: dict[str, Any]) -> None:
    one_turn(session)
    before, sessions = head(session), Session.objects.count()
    response = post_fork(client, session, body, auth)
    assert response.status_code == 400 and response.json()["code"] == "invalid_input"
    assert head(session) == before and Session.objects.count() == sessions


def test_no_fork_of_a_session_you_cannot_read(client: Client, session: Session, make_user: Any) -> None:
    seqs = one_turn(session)
    stranger = bearer(token_for(make_user("stranger")))
    before, sessions = head(session), Session.objects.count()
    response = post_fork(client, session, {"at_seq": seqs["end"], "policy": "historical"}, stranger)
    assert response.status_code == 404 and response.json()["code"] == "unknown_session"
    assert head(session) == before and Session.objects.count() == sessions
    assert post_fork(Client(), session, {"at_seq": seqs["end"], "policy": "fresh"}, {}).status_code == 401
    reviewer = make_reviewer(make_user("rev"))
    made = post_fork(client, session, {"at_seq": seqs["end"], "policy": "fresh"}, bearer(token_for(reviewer)))
    assert made.status_code == 201
    assert Session.objects.get(id=made.json()["id"]).owner_id == reviewer.pk


def test_openapi_documents_the_fork(client: Client) -> None:
    spec = client.get("/api/openapi.json").json()
    operation = spec["paths"]["/api/sessions/{session_id}/fork"]["post"]
    assert {"201", "422", "404"} <= set(operation["responses"])


async def test_the_socket_fork_frame(session: Session, owner: Any) -> None:
    seqs = await db(one_turn)(session)
    token = await db(token_for)(owner)
    comm = await open_socket(f"/ws/sessions/{session.id}/?token={token}")
    await synced(comm)
    await send(comm, {"type": "fork", "id": "f1", "at_seq": seqs["end"], "policy": "current"})
    ack = (await recv_until(comm, lambda f: f["type"] in ("ack", "error")))[-1]
    assert ack["type"] == "ack" and ack["op"] == "fork" and ack["id"] == "f1"
    child = ack["session"]
    assert child["parent"] == str(session.id) and child["at_seq"] == seqs["end"] and child["policy"] == "current"
    # the parent's socket then streams its one forked_to event
    note = (await recv_until(comm, lambda f: f["type"] == "event" and f["kind"] == "session/forked_to"))[-1]
    assert note["data"]["child"] == child["id"]
    await send(comm, {"type": "fork", "id": "f2", "at_seq": seqs["step_end"] - 1, "policy": "fresh"})
    error = (await recv_until(comm, lambda f: f["type"] in ("ack", "error")))[-1]
    assert error["type"] == "error" and error["id"] == "f2" and error["code"] == "invalid_fork_point"
    await send(comm, {"type": "fork", "id": "f3", "at_seq": 1, "policy": "nope"})
    bad = (await recv_until(comm, lambda f: f["type"] in ("ack", "error")))[-1]
    assert bad["code"] == "invalid_input"
    forks = await db(lambda: Event.objects.filter(session_id=session.id, kind="session/forked_to").count())()
    assert forks == 1
    await comm.disconnect()


# ---------------------------------------------------------------- the chat page's door


def test_page_actions_check_permission_and_csrf(session: Session, owner: Any, make_user: Any) -> None:
    from tests.helpers import client_for

    seqs = one_turn(session)
    message = Event.objects.get(session=session, kind="user/message").seq
    edit = f"/sessions/{session.id}/forks/edit/"
    before, sessions = head(session), Session.objects.count()
    stranger = client_for(make_user("stranger"))
    assert stranger.post(edit, {"seq": message, "text": "x"}).status_code == 404
    assert stranger.get(f"/sessions/{session.id}/forks/").status_code == 404
    assert Client().post(edit, {"seq": message, "text": "x"}).status_code == 302  # to the login page
    strict = client_for(owner, enforce_csrf_checks=True)
    assert strict.post(edit, {"seq": message, "text": "x"}).status_code == 403
    mine = client_for(owner)
    # not a user message: back to the chat, nothing made
    bad = mine.post(edit, {"seq": seqs["end"], "text": "x"})
    assert bad.status_code == 302 and bad["Location"].endswith(f"#ev-{seqs['end']}")
    assert head(session) == before and Session.objects.count() == sessions
    made = mine.post(edit, {"seq": message, "text": "edited"})
    child = Session.objects.exclude(id=session.id).get()
    assert made.status_code == 302 and made["Location"] == f"/sessions/{child.id}/"
    assert Event.objects.filter(session=child, kind="user/message").get().data == {"text": "edited"}
    # the panels: the fork's breadcrumb, the parent's marker
    crumb = mine.get(f"/sessions/{child.id}/forks/").content.decode()
    assert 'id="fork-crumb"' in crumb and f"/sessions/{session.id}/#ev-{message - 1}" in crumb
    marks = mine.get(f"/sessions/{session.id}/forks/").content.decode()
    assert f'data-at="{message - 1}"' in marks and f"/sessions/{child.id}/" in marks
    # a reviewer's fork is the reviewer's: the owner, who cannot read it, gets no marker for it
    reviewer = client_for(make_reviewer(make_user("rev")))
    theirs = reviewer.post(f"/sessions/{session.id}/forks/regenerate/", {"seq": seqs["end"] - 2})
    other = Session.objects.exclude(id__in=[session.id, child.id]).get()
    assert theirs["Location"] == f"/sessions/{other.id}/" and other.owner.username == "rev"
    assert f"/sessions/{other.id}/" in reviewer.get(f"/sessions/{session.id}/forks/").content.decode()
    assert f"/sessions/{other.id}/" not in mine.get(f"/sessions/{session.id}/forks/").content.decode()
