"""Helpers for the session-socket tests (WebsocketCommunicator)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from terret_site.asgi import application

ORIGIN = (b"origin", b"http://localhost")
_opened: list[Any] = []


@pytest.fixture(autouse=True)
async def fresh_channel_layer() -> Any:
    """Import into socket test modules. Each test runs on a new event loop; a
    layer instance carried over could hold state bound to the previous one."""
    channel_layers.backends.clear()
    yield
    # A test that failed half-way leaves sockets open: end their consumers on
    # this loop, or they would hold layer state into the next test.
    for comm in _opened:
        try:
            await comm.disconnect()
        except Exception:  # already finished, or cancelled by the disconnect
            pass
    _opened.clear()
    channel_layers.backends.clear()


def db(fn: Any) -> Any:
    """Run sync setup code off the event loop."""
    return database_sync_to_async(fn)


async def open_socket(path: str, *, headers: list[tuple[bytes, bytes]] | None = None, app: Any = None) -> Any:
    comm = WebsocketCommunicator(app or application, path, headers=headers or [])
    _opened.append(comm)
    connected, _ = await comm.connect(timeout=10)
    comm.connected = connected
    return comm


async def recv(comm: Any, timeout: float = 10) -> dict[str, Any]:  # noqa: ASYNC109 - mirrors receive_from
    return json.loads(await comm.receive_from(timeout=timeout))


async def recv_until(comm: Any, predicate: Any, timeout: float = 10) -> list[dict[str, Any]]:  # noqa: ASYNC109
    """Frames up to and including the first that satisfies `predicate`."""
    frames: list[dict[str, Any]] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise TimeoutError(f"no matching frame; got {frames[-5:]}")
        frames.append(await recv(comm, left))
        if predicate(frames[-1]):
            return frames


async def synced(comm: Any) -> list[dict[str, Any]]:
    """hello, the replayed events and synced."""
    return await recv_until(comm, lambda f: f["type"] == "synced")


async def closed_with(comm: Any, timeout: float = 10) -> int:  # noqa: ASYNC109
    """Read past any frames to the close; its code. Then let the consumer
    finish, as a browser's close handshake would."""
    while True:
        output = await comm.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            await comm.disconnect()
            return int(output.get("code", 1000))


def events_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "event"]


def cookie_headers(user: Any) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    return [(b"cookie", f"sessionid={cookie}".encode()), ORIGIN]


async def send(comm: Any, frame: Any) -> None:
    await comm.send_to(text_data=frame if isinstance(frame, str) else json.dumps(frame))


async def frames_until(ws: Any, predicate: Any, timeout: float = 30) -> list[dict[str, Any]]:  # noqa: ASYNC109
    """JSON frames from a websockets client until one meets `predicate`, that one included."""
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while True:
            frames.append(json.loads(await ws.recv()))
            if predicate(frames[-1]):
                return frames
