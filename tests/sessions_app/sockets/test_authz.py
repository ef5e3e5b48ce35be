"""The authorization matrix of the session socket: every client frame x every
kind of caller, on one socket per caller (a refused frame leaves the socket
usable, so the frames run in sequence). Refused frames append nothing."""

from __future__ import annotations

import pytest

from tests.sessions_app.apiutil import head, make_reviewer, new_session, park_calls, token_for
from tests.sessions_app.sockutil import ORIGIN, closed_with, db, fresh_channel_layer, open_socket, recv, send, synced

pytestmark = pytest.mark.django_db(transaction=True)
_ = fresh_channel_layer  # an autouse fixture

# In order; the open turn's parked calls c1 and c2 make approve/deny meaningful.
FRAMES = [
    ("ping", {}),
    ("set_model", {"role": "main", "spec": "demo/offline"}),
    ("set_policy", {"patterns": ["clock.*"]}),
    ("inject", {"text": "steer", "wake": False}),
    ("approve", {"call_id": "c1"}),
    ("deny", {"call_id": "c2", "reason": "no"}),
    ("compact", {}),
    ("retry", {}),  # the turn is parked, not blocked: allowed callers get not_blocked
    ("cancel", {}),
]
DRIVE = {"set_model", "set_policy", "inject", "compact", "retry", "cancel"}
APPROVE = {"approve", "deny"}
MAY = {
    "owner": DRIVE | {"ping"},
    "staff": DRIVE | {"ping"},
    "reviewer": APPROVE | {"ping"},
    "reviewing_owner": DRIVE | APPROVE | {"ping"},
}


@pytest.fixture
def world(make_user, settings):
    settings.TERRET_WORKER = "manual"
    owner = make_user("owner")
    session = new_session(owner)
    park_calls(session.id, "c1", "c2")
    users = {
        "owner": lambda: owner,
        "staff": lambda: make_user("staff", is_staff=True),
        "reviewer": lambda: make_reviewer(make_user("reviewer")),
        "reviewing_owner": lambda: make_reviewer(owner),
        "stranger": lambda: make_user("stranger"),
    }
    return {"sid": session.id, "users": users, "owner": owner}


@pytest.mark.parametrize("role", list(MAY))
async def test_every_frame_for_every_role(world, role):
    user = await db(world["users"][role])()
    comm = await open_socket(f"/ws/sessions/{world['sid']}/?token={await db(token_for)(user)}")
    frames = await synced(comm)
    assert frames[0]["can_drive"] == bool(MAY[role] & DRIVE)
    assert frames[0]["can_approve"] == bool(MAY[role] & APPROVE)
    for n, (kind, fields) in enumerate(FRAMES):
        before = await db(head)(world["sid"])
        await send(comm, {"type": kind, "id": n, **fields})
        reply = await recv(comm)
        while reply["type"] == "event":
            reply = await recv(comm)
        assert reply["id"] == n
        if kind in MAY[role] and kind == "retry":
            assert (reply["type"], reply["code"]) == ("error", "not_blocked"), (kind, reply)
            assert await db(head)(world["sid"]) == before
        elif kind in MAY[role]:
            assert reply["type"] == "ack", (kind, reply)
            assert reply["op"] == kind
        else:
            assert (reply["type"], reply["code"]) == ("error", "not_allowed"), (kind, reply)
            assert await db(head)(world["sid"]) == before
    await comm.disconnect()


@pytest.mark.parametrize(
    ("role", "close_code"), [("stranger", 4404), ("anonymous", 4401), ("revoked", 4401), ("inactive", 4401)]
)
async def test_callers_who_may_not_read_get_no_socket(world, make_user, role, close_code):
    from sessions_app.models import ApiToken
    from sessions_app.services import tokens as auth

    def credentials():
        if role == "anonymous":
            return ""
        if role == "stranger":
            return token_for(world["users"]["stranger"]())
        raw = token_for(world["owner"])
        if role == "revoked":
            auth.revoke(ApiToken.objects.filter(prefix=raw[:12]))
        else:
            world["owner"].is_active = False
            world["owner"].save()
        return raw

    token = await db(credentials)()
    query = f"?token={token}" if token else ""
    comm = await open_socket(f"/ws/sessions/{world['sid']}/{query}", headers=[ORIGIN])  # a browser page without a login
    error = await recv(comm)
    assert error["type"] == "error" and error["code"] in {"unauthenticated", "unknown_session"}
    assert await closed_with(comm) == close_code
