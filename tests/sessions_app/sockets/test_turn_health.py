"""Turn health on the session socket: hello says whether the session is
blocked (and why) or waits for an agent slot, the `retry` frame drives a
blocked turn again like POST …/retry, and cancel's ack says whether the turn
is already closed."""

from __future__ import annotations

from datetime import datetime

import pytest

from sessions_app import log
from tests.sessions_app.apiutil import block_turn, head, make_reviewer, token_for
from tests.sessions_app.sockutil import db, events_of, fresh_channel_layer, open_socket, recv, recv_until, send, synced

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer  # an autouse fixture


def path(world, token=None, after=None):
    tail = f"&after={after}" if after is not None else ""
    return f"/ws/sessions/{world['sid']}/?token={token or world['token']}{tail}"


async def test_hello_of_an_idle_session(world):
    comm = await open_socket(path(world))
    hello = (await synced(comm))[0]
    assert (hello["status"], hello["blocked"], hello["waiting"]) == ("idle", None, None)


async def test_hello_of_a_blocked_session_says_why(world):
    await db(block_turn)(world["sid"], "the model provider failed 4 times: 503", 4)
    comm = await open_socket(path(world))
    hello = (await synced(comm))[0]
    assert hello["status"] == "blocked"
    assert hello["blocked"]["reason"] == "the model provider failed 4 times: 503"
    assert hello["blocked"]["attempts"] == 4
    assert datetime.fromisoformat(hello["blocked"]["since"]).tzinfo is not None
    assert hello["last_seq"] == await db(head)(world["sid"])


async def test_hello_of_a_session_waiting_for_an_agent_slot(world):
    await db(log.append)(world["sid"], "agent/waiting", {"reason": "the registry is full", "live": 1})
    comm = await open_socket(path(world))
    hello = (await synced(comm))[0]
    assert hello["waiting"]["reason"] == "the registry is full"
    assert hello["blocked"] is None


async def test_retry_frame_drives_a_blocked_turn_again_and_the_event_follows(world):
    blocked_seq = await db(block_turn)(world["sid"])
    comm = await open_socket(path(world, after=blocked_seq))
    await synced(comm)
    await send(comm, {"type": "retry", "id": "r1"})
    frames = await recv_until(comm, lambda f: f["type"] == "ack")
    if not events_of(frames):  # the event may come just before or just after the ack
        frames += await recv_until(comm, lambda f: f["type"] == "event")
    ack = next(f for f in frames if f["type"] == "ack")
    assert ack == {"type": "ack", "id": "r1", "op": "retry", "status": "running"}
    [event] = events_of(frames)
    assert (event["kind"], event["data"]) == ("turn/retry_requested", {"by": "owner"})


async def test_retry_frame_when_not_blocked_is_an_error_and_appends_nothing(world):
    comm = await open_socket(path(world))
    await synced(comm)
    before = await db(head)(world["sid"])
    await send(comm, {"type": "retry", "id": 7})
    reply = await recv(comm)
    assert (reply["type"], reply["id"], reply["code"]) == ("error", 7, "not_blocked")
    assert await db(head)(world["sid"]) == before
    await send(comm, {"type": "retry", "id": 8, "extra": 1})
    assert (await recv(comm))["code"] == "invalid_input"  # unknown fields are refused, like every frame


async def test_retry_frame_from_a_reviewer_is_not_allowed(world, make_user):
    await db(block_turn)(world["sid"])
    reviewer = await db(lambda: make_reviewer(make_user("rita")))()
    comm = await open_socket(path(world, token=await db(token_for)(reviewer)))
    hello = (await synced(comm))[0]
    assert hello["status"] == "blocked" and hello["can_drive"] is False
    before = await db(head)(world["sid"])
    await send(comm, {"type": "retry", "id": "x"})
    reply = await recv(comm)
    assert (reply["type"], reply["code"]) == ("error", "not_allowed")
    assert await db(head)(world["sid"]) == before


async def test_cancel_ack_says_the_turn_is_closed_when_no_worker_held_it(world):
    blocked_seq = await db(block_turn)(world["sid"])
    comm = await open_socket(path(world, after=blocked_seq))
    await synced(comm)
    await send(comm, {"type": "cancel", "id": "c"})
    frames: list = []
    while not (any(f["type"] == "ack" for f in frames) and any(f.get("kind") == "turn/end" for f in frames)):
        frames.append(await recv(comm))
    ack = next(f for f in frames if f["type"] == "ack")
    assert (ack["op"], ack["cancelled"], ack["closed"]) == ("cancel", True, True)
    assert [f["kind"] for f in events_of(frames)] == ["turn/cancel_requested", "turn/end"]
