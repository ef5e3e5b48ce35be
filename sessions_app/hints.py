"""Hints to the session's channel-layer group, sent after commit.

A hint says "session S has events up to seq N" (or carries a streamed token
delta). It is never the data itself: a hint can be lost, coalesced or arrive
late, and readers always catch up from the database by seq. That is what lets
appenders hand hints to a background thread instead of waiting on Redis.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def group_name(session_id: uuid.UUID | str) -> str:
    return f"session.{uuid.UUID(str(session_id)).hex}"


DASHBOARD_GROUP = "terret.dashboard"


class _Publisher:
    """Owns an event loop thread that performs group_send calls.

    With the in-memory layer the groups live in the ASGI server's own loop, so
    sends are scheduled there instead (the server registers its loop when the
    first websocket connects); with no registered loop nobody in this process
    can be listening, and hints are dropped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server_loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[uuid.UUID, int] = {}
        self._scheduled = False

    def register_server_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._server_loop = loop

    def _target_loop(self) -> asyncio.AbstractEventLoop | None:
        layer = get_channel_layer()
        if layer is None:
            return None
        if type(layer).__name__ == "InMemoryChannelLayer":
            loop = self._server_loop
            return loop if loop is not None and not loop.is_closed() else None
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="terret-hints", daemon=True).start()
                self._loop = loop
            return self._loop

    def event(self, session_id: uuid.UUID, seq: int) -> None:
        loop = self._target_loop()
        if loop is None:
            return
        with self._lock:
            # Coalesce: one hint per session carries the newest seq.
            if self._pending.get(session_id, 0) < seq:
                self._pending[session_id] = seq
            if self._scheduled:
                return
            self._scheduled = True
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._flush()))

    async def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            self._scheduled = False
        layer = get_channel_layer()
        if layer is None:
            return
        for sid, seq in pending.items():
            try:
                await layer.group_send(group_name(sid), {"type": "log.hint", "seq": seq})
            except Exception:  # a lost hint is allowed; readers catch up by seq
                log.warning("hint for session %s seq %s was not sent", sid, seq, exc_info=True)
        if pending:
            # One dashboard hint per flush, naming every session that moved.
            try:
                await layer.group_send(DASHBOARD_GROUP, {"type": "log.hint", "sessions": [str(s) for s in pending]})
            except Exception:
                log.warning("dashboard hint was not sent", exc_info=True)

    def message(self, group: str, message: dict[str, Any]) -> None:
        loop = self._target_loop()
        if loop is None:
            return
        layer = get_channel_layer()

        async def send() -> None:
            try:
                await layer.group_send(group, message)  # type: ignore[union-attr]
            except Exception:
                log.warning("message to %s was not sent", group, exc_info=True)

        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(send()))


publisher = _Publisher()


def publish_event(session_id: uuid.UUID, seq: int) -> None:
    publisher.event(session_id, seq)


def publish_delta(session_id: uuid.UUID | str, payload: dict[str, Any]) -> None:
    """Streamed token deltas: live only, never durable."""
    publisher.message(group_name(session_id), {"type": "log.delta", **payload})
