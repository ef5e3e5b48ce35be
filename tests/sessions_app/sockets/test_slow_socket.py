"""A slow socket never holds more than its byte bound (issue 33.6,
live/outbox.py): with the client not reading, the outbox stops at
TERRET_SOCKET_OUTBOX_BYTES (not at 256 frames of up to a MiB each), deltas
that do not fit are dropped, and once the client reads again the socket
catches up from the log: every event, once, in seq order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sessions_app import log
from sessions_app.live import hub
from sessions_app.live.follow import Follower
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket, recv_until, synced

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer  # an autouse fixture

BOUND = 256 * 1024
EVENTS = 40
TEXT = "x" * 40_000  # 40 events of ~40 KB: ~1.6 MB behind, 6 times the bound


def flood(sid: Any) -> None:
    for i in range(EVENTS):
        log.append(sid, "input/queued", {"text": f"{i:03d}{TEXT}", "wake": False})


async def test_a_slow_socket_never_holds_more_than_its_byte_bound(world: Any, settings: Any, monkeypatch: Any) -> None:
    settings.TERRET_SOCKET_MAX_FRAME_BYTES = 64 * 1024
    settings.TERRET_SOCKET_OUTBOX_BYTES = BOUND
    settings.TERRET_SOCKET_TAIL_BYTES = BOUND
    sockets: list[Follower] = []
    gate = asyncio.Event()
    gate.set()
    send_frame = Follower.send_frame

    async def slow_send(self: Follower, text: str) -> None:
        if self not in sockets:
            sockets.append(self)
        await gate.wait()  # the client stops reading: the writer's send blocks
        await send_frame(self, text)

    monkeypatch.setattr(Follower, "send_frame", slow_send)
    comm = await open_socket(f"/ws/sessions/{world['sid']}/?token={world['token']}")
    await synced(comm)
    (socket,) = sockets
    gate.clear()
    await db(flood)(world["sid"])
    # The pump reads ahead until the outbox is full, then waits on it.
    for _ in range(100):
        if socket.outbox.nbytes + 41_000 > BOUND:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # it stays there however long the client sleeps
    assert BOUND - 41_000 < socket.outbox.nbytes <= BOUND
    assert socket.outbox.peak_bytes <= BOUND
    assert len(socket.outbox) < EVENTS  # the suffix is not queued: the log holds it
    dropped = socket.deltas_dropped
    socket.on_delta('{"type": "delta", "step": 1, "text": "' + "d" * 60_000 + '"}')
    assert socket.deltas_dropped == dropped + 1  # best-effort, dropped at the byte bound
    tail = hub.frame_cache()._tails[world["sid"]]
    assert tail.nbytes <= BOUND  # the process's frame cache is bounded in bytes too
    gate.set()
    last = f"{EVENTS - 1:03d}"
    got = await recv_until(comm, lambda f: f.get("type") == "event" and f["data"]["text"].startswith(last))
    texts = [f["data"]["text"][:3] for f in got if f.get("type") == "event"]
    assert texts == [f"{i:03d}" for i in range(EVENTS)]  # caught up from the log: all, once, in order
    seqs = [f["seq"] for f in got if f.get("type") == "event"]
    assert seqs == list(range(seqs[0], seqs[0] + EVENTS))
    assert socket.outbox.peak_bytes <= BOUND
    await comm.disconnect()
