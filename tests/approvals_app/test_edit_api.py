"""Approve with edits and allow-for-session through the JSON API and the
session socket's decision frames: the same rules as the service, the same
error codes, and nothing appended by a refusal."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import Event
from tests.sessions_app.apiutil import call, event_count, make_reviewer, new_session, park_calls, token_for
from tests.sessions_app.apiutil import session_url as url
from tests.sessions_app.sockutil import fresh_channel_layer, open_socket, recv_until, send, synced

_ = fresh_channel_layer  # an autouse fixture

EDIT = {"path": "c1.txt", "content": "edited by the reviewer"}


@pytest.fixture
def parked(make_user: Any) -> dict[str, Any]:
    reviewer = make_reviewer(make_user("rev"))
    session = new_session(make_user("owner"))
    park_calls(session.id, "c1")
    request_seq = Event.objects.get(session=session, kind="approval/requested").seq
    return {"session": session, "token": token_for(reviewer), "seq": request_seq}


def auth(parked: dict[str, Any]) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {parked['token']}"}


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_api_approval_with_edited_args_and_allow_for_session(client: Any, parked: dict[str, Any]) -> None:
    body = {"verdict": "approve", "request_seq": parked["seq"], "edited_args": EDIT, "allow_for_session": True}
    response = call(client, "POST", url(parked["session"], "/approvals/c1"), body, **auth(parked))
    assert response.status_code == 200, response.data
    assert response.data["edited_args"] == EDIT and response.data["allowed_for_session"] is True
    verdict = Event.objects.get(session=parked["session"], kind="approval/resolved")
    assert verdict.seq == response.data["seq"] and verdict.data["edited_args"] == EDIT
    policy = Event.objects.get(session=parked["session"], kind="policy/updated")
    assert policy.seq == verdict.seq - 1 and policy.data["auto_approve"] == ["workspace.write"]


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"verdict": "approve", "edited_args": {"path": "c1.txt"}}, "do not fit workspace.write"),
        ({"verdict": "approve", "edited_args": "{}"}, "edited_args"),
        ({"verdict": "deny", "edited_args": EDIT}, "not a denial"),
        ({"verdict": "deny", "allow_for_session": True}, "not a denial"),
        ({"verdict": "approve", "allow_for_session": "yes"}, "allow_for_session"),
    ],
)
def test_api_refuses_a_bad_edit_and_appends_nothing(
    client: Any, parked: dict[str, Any], body: dict[str, Any], needle: str
) -> None:
    before = event_count()
    response = call(client, "POST", url(parked["session"], "/approvals/c1"), body, **auth(parked))
    assert response.status_code == 400 and response.data["code"] == "invalid_input"
    assert needle in response.data["message"]
    assert event_count() == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
async def test_socket_approve_frame_carries_edited_args(parked: dict[str, Any]) -> None:
    sid, token = parked["session"].id, parked["token"]
    comm = await open_socket(f"/ws/sessions/{sid}/?token={token}")
    await synced(comm)
    await send(comm, {"type": "approve", "id": "e1", "call_id": "c1", "edited_args": EDIT, "allow_for_session": True})
    [*_, ack] = await recv_until(comm, lambda f: f.get("type") in ("ack", "error") and f.get("id") == "e1")
    assert ack["type"] == "ack" and ack["edited_args"] == EDIT and ack["allowed_for_session"] is True
    await send(comm, {"type": "approve", "id": "e2", "call_id": "c1", "edited_args": ["x"]})
    [*_, refused] = await recv_until(comm, lambda f: f.get("type") in ("ack", "error") and f.get("id") == "e2")
    assert refused["type"] == "error" and refused["code"] == "invalid_input"
    await comm.disconnect()
