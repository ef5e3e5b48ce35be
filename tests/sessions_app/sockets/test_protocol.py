"""The session socket's protocol (docs/protocol.md), with WebsocketCommunicator
against the real ASGI application (token and cookie auth, routing, consumer).
Events come from real appends; the consumer reads them from the database."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from django.db import transaction
from django.urls import re_path

from sessions_app import log
from sessions_app.live import follow, hub
from sessions_app.live.auth import SocketAuthStack
from sessions_app.live.follow import OUTBOX_MAX
from sessions_app.log import hints
from sessions_app.models import ApiToken
from sessions_app.services import tokens
from sessions_app.sockets.session import MAX_FRAME_BYTES, SessionConsumer
from tests.sessions_app.apiutil import head, token_for
from tests.sessions_app.sockutil import (
    closed_with,
    cookie_headers,
    db,
    events_of,
    fresh_channel_layer,
    open_socket,
    recv,
    recv_until,
    send,
    synced,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer  # an autouse fixture


def path(world, after=None, token=None):
    query = [f"token={token or world['token']}"]
    if after is not None:
        query.append(f"after={after}")
    return f"/ws/sessions/{world['sid']}/?{'&'.join(query)}"


def queue(sid, n, prefix="m"):
    """n input/queued events, appended one commit each."""
    for i in range(n):
        log.append(sid, "input/queued", {"text": f"{prefix}{i}", "wake": False})


# ---------------------------------------------------------------- delivery


async def test_hello_then_replay_from_after_then_synced_then_live(world):
    await db(queue)(world["sid"], 4)  # seqs 2..5 after agent/spawned
    comm = await open_socket(path(world, after=2))
    frames = await synced(comm)
    hello = frames[0]
    assert hello["type"] == "hello" and hello["session"] == str(world["sid"])
    assert hello["last_seq"] == 5 and hello["after"] == 2
    assert hello["can_drive"] is True and hello["can_approve"] is False
    # The agent version its first turn will open on (the demo profile's only one).
    assert hello["version"]["number"] == 1 and hello["version"]["latest"] == 1
    assert [f["seq"] for f in events_of(frames)] == [3, 4, 5]
    event = events_of(frames)[0]
    assert set(event) == {"type", "seq", "kind", "data", "at"}
    assert event["kind"] == "input/queued" and event["data"] == {"text": "m1", "wake": False}
    assert frames[-1] == {"type": "synced", "seq": 5}

    await db(queue)(world["sid"], 2, "live")
    live = await recv_until(comm, lambda f: f.get("seq") == 7)
    assert [(f["seq"], f["data"]["text"]) for f in events_of(live)] == [(6, "live0"), (7, "live1")]
    await comm.disconnect()


async def test_replay_reads_past_one_page(world):
    def many():
        with log.locked(world["sid"]) as tx:
            for i in range(2500):
                tx.append("input/queued", {"text": f"bulk{i}", "wake": False})

    await db(many)()
    comm = await open_socket(path(world))
    frames = await synced(comm)
    assert [f["seq"] for f in events_of(frames)] == list(range(1, 2502))
    await comm.disconnect()


async def test_reconnecting_with_after_misses_nothing_and_repeats_nothing(world):
    await db(queue)(world["sid"], 3)
    first = await open_socket(path(world))
    seen = events_of(await synced(first))
    await first.disconnect()
    await db(queue)(world["sid"], 3, "while-away")  # appended while the client is gone
    again = await open_socket(path(world, after=seen[-1]["seq"]))
    seen += events_of(await synced(again))
    await db(queue)(world["sid"], 1, "after")
    seen += events_of(await recv_until(again, lambda f: f["type"] == "event"))
    seqs = [f["seq"] for f in seen]
    assert seqs == list(range(1, await db(head)(world["sid"]) + 1))
    await again.disconnect()


async def test_many_sockets_on_one_session_each_get_every_event_once(world):
    comms = [await open_socket(path(world)) for _ in range(10)]
    for comm in comms:
        await synced(comm)
    await db(queue)(world["sid"], 20)
    last = await db(head)(world["sid"])
    for comm in comms:
        frames = await recv_until(comm, lambda f, last=last: f.get("seq") == last)
        assert [f["seq"] for f in events_of(frames)] == list(range(2, last + 1))
        await comm.disconnect()


async def test_a_lost_hint_is_caught_up_by_the_poll(world, monkeypatch):
    monkeypatch.setattr(follow, "POLL_SECONDS", 0.2)
    comm = await open_socket(path(world))
    await synced(comm)
    monkeypatch.setattr(hints, "publish_event", lambda *a, **k: None)  # every hint is lost
    await db(queue)(world["sid"], 2)
    frames = await recv_until(comm, lambda f: f.get("seq") == 3, timeout=5)
    assert [f["seq"] for f in events_of(frames)] == [2, 3]
    await comm.disconnect()


@pytest.mark.postgres
async def test_only_committed_events_are_sent(world):
    """A hint naming an uncommitted seq sends nothing: the consumer reads the
    database, never the hint. After the commit the event arrives."""
    comm = await open_socket(path(world))
    await synced(comm)
    appended, release = threading.Event(), threading.Event()

    def hold_open():
        with transaction.atomic():
            log.append(world["sid"], "input/queued", {"text": "pending", "wake": False})
            appended.set()
            release.wait(10)

    worker = threading.Thread(target=hold_open)
    worker.start()
    await asyncio.get_running_loop().run_in_executor(None, appended.wait, 10)
    await get_channel_layer().group_send(hints.group_name(world["sid"]), {"type": "log.hint", "seq": 2})
    assert await comm.receive_nothing(timeout=0.5)
    release.set()
    await asyncio.get_running_loop().run_in_executor(None, worker.join, 10)
    [event] = events_of(await recv_until(comm, lambda f: f["type"] == "event"))
    assert event["seq"] == 2 and event["data"]["text"] == "pending"
    await comm.disconnect()


async def test_deltas_are_streamed_live(world):
    comm = await open_socket(path(world))
    await synced(comm)
    hints.publish_delta(world["sid"], {"step": 1, "text": "Hel"})
    frame = await recv(comm)
    assert frame == {"type": "delta", "step": 1, "text": "Hel"}
    await comm.disconnect()


class SlowConsumer(SessionConsumer):
    """A client that reads nothing until `gate` opens."""

    gate: asyncio.Event
    instances: list[SlowConsumer] = []

    async def connect(self):
        SlowConsumer.instances.append(self)
        await super().connect()

    async def send(self, text_data=None, bytes_data=None, close=False):
        await self.gate.wait()
        await super().send(text_data=text_data, bytes_data=bytes_data, close=close)


async def test_a_slow_client_is_bounded_and_blocks_no_one(world):
    SlowConsumer.gate = asyncio.Event()
    SlowConsumer.instances = []
    slow_app = SocketAuthStack(URLRouter([re_path(r"^ws/sessions/(?P<session_id>[^/]+)/$", SlowConsumer.as_asgi())]))
    slow = await open_socket(path(world), app=slow_app)
    fast = await open_socket(path(world))
    await synced(fast)
    await db(queue)(world["sid"], 1500)
    last = await db(head)(world["sid"])
    frames = await recv_until(fast, lambda f: f.get("seq") == last, timeout=30)
    assert [f["seq"] for f in events_of(frames)] == list(range(2, last + 1))
    [consumer] = SlowConsumer.instances
    # The slow socket's queue never grew past its bound: the rest waits in the database.
    assert consumer.outbox.qsize() <= OUTBOX_MAX
    assert consumer.last_sent < last
    SlowConsumer.gate.set()
    frames = await recv_until(slow, lambda f: f.get("seq") == last, timeout=30)
    assert [f["seq"] for f in events_of(frames)] == list(range(1, last + 1))
    await slow.disconnect()
    await fast.disconnect()


# ---------------------------------------------------------------- client frames


async def test_inject_is_acked_with_its_receipt_and_the_event_follows(world):
    comm = await open_socket(path(world))
    await synced(comm)
    await send(comm, {"type": "inject", "id": "a1", "text": "hello", "wake": False, "idempotency_key": "k1"})
    frames = await recv_until(comm, lambda f: f["type"] == "ack")
    frames += await recv_until(comm, lambda f: f["type"] == "event") if not events_of(frames) else []
    ack = next(f for f in frames if f["type"] == "ack")
    assert ack["id"] == "a1" and ack["op"] == "inject"
    assert ack["receipt"]["disposition"] == "queued" and ack["receipt"]["replayed"] is False
    [event] = events_of(frames)
    assert event["seq"] == ack["receipt"]["seq"] and event["data"]["text"] == "hello"

    await send(comm, {"type": "inject", "id": "a2", "text": "hello", "wake": False, "idempotency_key": "k1"})
    again = await recv(comm)
    assert again["type"] == "ack" and again["receipt"] == {**ack["receipt"], "replayed": True}
    await send(comm, {"type": "inject", "id": "a3", "text": "other", "idempotency_key": "k1"})
    conflict = await recv(comm)
    assert conflict == {
        "type": "error",
        "id": "a3",
        "code": "idempotency_conflict",
        "message": conflict["message"],
    }
    assert await db(head)(world["sid"]) == event["seq"]
    await comm.disconnect()


async def test_replies_come_in_frame_order_and_echo_ids(world):
    comm = await open_socket(path(world))
    await synced(comm)
    await send(comm, {"type": "ping", "id": 1})
    await send(comm, {"type": "nonsense", "id": 2})
    await send(comm, {"type": "set_model", "id": "three", "role": "main", "spec": "demo/offline"})
    await send(comm, {"type": "ping"})
    replies = [
        f for f in await recv_until(comm, lambda f: f["type"] == "ack" and "id" not in f) if f["type"] != "event"
    ]
    assert [(r["type"], r.get("id")) for r in replies] == [("ack", 1), ("error", 2), ("ack", "three"), ("ack", None)]
    assert replies[2]["op"] == "set_model" and replies[2]["spec"] == "demo/offline"
    await comm.disconnect()


BAD_FRAMES = [
    ("not json", "invalid_json"),
    ("[1, 2]", "invalid_frame"),
    ('"inject"', "invalid_frame"),
    ("{}", "invalid_input"),
    ('{"type": 7}', "invalid_input"),
    ('{"type": "injekt", "text": "x"}', "unknown_type"),
    ('{"type": "inject"}', "invalid_input"),
    ('{"type": "inject", "text": 5}', "invalid_input"),
    ('{"type": "inject", "text": ""}', "invalid_input"),
    ('{"type": "inject", "text": "   "}', "invalid_input"),
    ('{"type": "inject", "text": "hi", "wake": "yes"}', "invalid_input"),
    ('{"type": "inject", "text": "hi", "surprise": 1}', "invalid_input"),
    ('{"type": "inject", "text": "hi", "idempotency_key": ""}', "invalid_input"),
    ('{"type": "inject", "text": "hi", "id": {"x": 1}}', "invalid_input"),
    ('{"type": "approve"}', "invalid_input"),
    ('{"type": "deny", "call_id": 3}', "invalid_input"),
    ('{"type": "set_policy", "patterns": "clock.*"}', "invalid_input"),
    ('{"type": "set_policy", "patterns": ["bad pattern"]}', "invalid_pattern"),
    ('{"type": "set_model", "role": "boss", "spec": "x/y"}', "invalid_input"),
    ('{"type": "set_model", "role": "main"}', "invalid_input"),
    ('{"type": "cancel", "now": true}', "invalid_input"),
    ("[" * 100_000, "invalid_json"),
]


@pytest.mark.parametrize(("frame", "code"), BAD_FRAMES)
async def test_bad_frames_get_an_error_append_nothing_and_keep_the_socket(world, frame, code):
    comm = await open_socket(path(world))
    await synced(comm)
    before = await db(head)(world["sid"])
    await send(comm, frame)
    error = await recv(comm)
    assert error["type"] == "error" and error["code"] == code, error
    await send(comm, {"type": "ping", "id": "still-there"})
    assert (await recv(comm))["id"] == "still-there"
    assert await db(head)(world["sid"]) == before
    await comm.disconnect()


async def test_binary_and_oversized_frames_are_refused_and_the_socket_stays(world):
    comm = await open_socket(path(world))
    await synced(comm)
    await comm.send_to(bytes_data=b'{"type": "ping"}')
    assert (await recv(comm))["code"] == "invalid_frame"
    text = "é" * (MAX_FRAME_BYTES // 2)  # fits in characters, not in bytes
    await send(comm, {"type": "inject", "id": "big", "text": text})
    error = await recv(comm)
    assert error["code"] == "frame_too_large" and "id" not in error
    await send(comm, {"type": "ping", "id": "ok"})
    assert (await recv(comm))["type"] == "ack"
    assert await db(head)(world["sid"]) == 1
    await comm.disconnect()


# ---------------------------------------------------------------- connecting


async def test_connect_refusals_send_an_error_then_close(world, make_user):
    stranger_token = await db(token_for)(await db(make_user)("stranger"))
    cases = [
        (f"/ws/sessions/{world['sid']}/", 4401, "unauthenticated"),
        (f"/ws/sessions/{world['sid']}/?token=trt_bogus", 4401, "unauthenticated"),
        (f"/ws/sessions/{uuid.uuid4()}/?token={world['token']}", 4404, "unknown_session"),
        (f"/ws/sessions/not-a-uuid/?token={world['token']}", 4404, "unknown_session"),
        (f"/ws/sessions/{world['sid']}/?token={stranger_token}", 4404, "unknown_session"),
        (f"/ws/sessions/{world['sid']}/?token={world['token']}&after=-1", 4400, "invalid_input"),
        (f"/ws/sessions/{world['sid']}/?token={world['token']}&after=abc", 4400, "invalid_input"),
    ]
    for url, close_code, error_code in cases:
        comm = await open_socket(url, headers=[(b"origin", b"http://localhost")])
        error = await recv(comm)
        assert (error["type"], error["code"]) == ("error", error_code), url
        assert await closed_with(comm) == close_code, url


async def test_bearer_header_authenticates_too(world):
    comm = await open_socket(
        f"/ws/sessions/{world['sid']}/", headers=[(b"authorization", f"Bearer {world['token']}".encode())]
    )
    assert (await recv(comm))["type"] == "hello"
    await comm.disconnect()


async def test_cookie_auth_needs_an_allowed_origin(world):
    headers = await db(cookie_headers)(world["owner"])
    comm = await open_socket(f"/ws/sessions/{world['sid']}/", headers=headers)
    assert (await recv(comm))["type"] == "hello"
    await comm.disconnect()
    foreign = [h for h in headers if h[0] != b"origin"] + [(b"origin", b"https://evil.example")]
    assert not (await open_socket(f"/ws/sessions/{world['sid']}/", headers=foreign)).connected
    no_origin = [h for h in headers if h[0] != b"origin"]
    assert not (await open_socket(f"/ws/sessions/{world['sid']}/", headers=no_origin)).connected


async def test_token_sockets_are_not_origin_checked(world):
    comm = await open_socket(path(world), headers=[(b"origin", b"https://elsewhere.example")])
    assert (await recv(comm))["type"] == "hello"
    await comm.disconnect()


# ---------------------------------------------------------------- losing access


async def test_a_revoked_token_stops_the_next_frame_and_closes_4403(world):
    comm = await open_socket(path(world))
    await synced(comm)
    await db(tokens.revoke)(ApiToken.objects.all())
    await send(comm, {"type": "inject", "id": "x", "text": "hi", "wake": False})
    error = await recv(comm)
    assert error["code"] == "not_allowed" and error["id"] == "x"
    assert await closed_with(comm) == 4403
    assert await db(head)(world["sid"]) == 1


async def test_a_deactivated_user_is_cut_off_by_the_poll(world, monkeypatch):
    monkeypatch.setattr(follow, "POLL_SECONDS", 0.2)
    comm = await open_socket(path(world))
    await synced(comm)

    def deactivate():
        world["owner"].is_active = False
        world["owner"].save()

    await db(deactivate)()
    error = await recv(comm, timeout=5)
    assert error["type"] == "error" and error["code"] == "not_allowed"
    assert await closed_with(comm) == 4403


async def test_hello_is_json_only_and_frames_are_text(world):
    comm = await open_socket(path(world))
    output = await comm.receive_output(timeout=10)
    assert output["type"] == "websocket.send" and output.get("bytes") is None
    assert json.loads(output["text"])["type"] == "hello"
    await comm.disconnect()


class Recorder:
    def __init__(self) -> None:
        self.hints: list[int] = []
        self.deltas: list[str] = []
        self.got_delta = asyncio.Event()

    def on_hint(self, seq: int) -> None:
        self.hints.append(seq)

    def on_delta(self, frame: str) -> None:
        self.deltas.append(frame)
        self.got_delta.set()


async def test_the_hub_fans_one_subscription_out_and_survives_a_failed_join(monkeypatch):
    layer, the_hub, sid = get_channel_layer(), hub.Hub(), uuid.uuid4()
    real_group_add = layer.group_add

    async def redis_down(group, channel):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(layer, "group_add", redis_down)
    with pytest.raises(ConnectionError):
        await the_hub.subscribe(sid, Recorder())
    monkeypatch.setattr(layer, "group_add", real_group_add)
    first, second = Recorder(), Recorder()
    await asyncio.wait_for(the_hub.subscribe(sid, first), 5)  # nothing half-made is left to wait on
    await the_hub.subscribe(sid, second)
    await layer.group_send(hints.group_name(sid), {"type": "log.hint", "seq": 5})
    await layer.group_send(hints.group_name(sid), {"type": "log.delta", "step": 2, "text": "hi"})
    async with asyncio.timeout(5):
        await first.got_delta.wait()
        await second.got_delta.wait()
    assert first.hints == second.hints == [5]
    assert json.loads(first.deltas[0]) == {"type": "delta", "step": 2, "text": "hi"}
    await the_hub.unsubscribe(sid, first)
    await the_hub.unsubscribe(sid, second)
    assert not the_hub._watches
