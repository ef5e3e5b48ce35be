"""A verdict after its request expired (approval/expired, on_expiry deny) is
refused approval_expired on the page and the session socket too (the API's
and /lg/'s answers are in test_deadlines.py and lg/test_door.py); nothing is
appended."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from sessions_app import log
from sessions_app.models import Event
from tests.approvals_app.conftest import park
from tests.sessions_app.apiutil import make_reviewer, new_session, token_for
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket, recv_until, send, synced

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer  # an autouse fixture

CLOCK = {"deadline_s": 5, "remind_every_s": None, "escalate_to": None, "on_expiry": "deny"}


def expired_request(make_user: Any) -> dict[str, Any]:
    """A reviewer's own session whose call c1 waited past its deadline."""
    owner = make_reviewer(make_user("owner"))
    session = new_session(owner)
    seq = park(session.id, deadline=CLOCK)
    log.append(
        session.id, "approval/expired", {"call_id": "c1", "request_seq": seq, "deadline_s": 5, "on_expiry": "deny"}
    )
    return {"owner": owner, "sid": session.id, "seq": seq, "token": token_for(owner), "before": Event.objects.count()}


def test_the_page_says_approval_expired(make_user: Any) -> None:
    world = expired_request(make_user)
    client = Client()
    client.force_login(world["owner"])
    form = {"call_id": "c1", "seq": world["seq"], "verdict": "approve"}
    response = client.post(f"/approvals/sessions/{world['sid']}/decide/", form, HTTP_HX_REQUEST="true")
    assert response["X-Terret-Error"] == "approval_expired"
    assert "not decided in time" in response.content.decode()
    assert Event.objects.count() == world["before"]


async def test_the_socket_answers_approval_expired(make_user: Any) -> None:
    world = await db(expired_request)(make_user)
    comm = await open_socket(f"/ws/sessions/{world['sid']}/?token={world['token']}")
    await synced(comm)
    await send(comm, {"type": "approve", "call_id": "c1", "id": "late"})
    reply = (await recv_until(comm, lambda f: f.get("id") == "late"))[-1]
    assert (reply["type"], reply["code"]) == ("error", "approval_expired"), reply
    assert await db(Event.objects.count)() == world["before"]
    await comm.disconnect()
