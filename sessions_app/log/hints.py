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
from dataclasses import dataclass
from typing import Any

import redis
from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings

log = logging.getLogger(__name__)


def group_name(session_id: uuid.UUID | str) -> str:
    return f"session.{uuid.UUID(str(session_id)).hex}"


DASHBOARD_GROUP = "terret.dashboard"


class _Publisher:
    """Sends hints from a background thread.

    Sends are batched over a short window (WINDOW seconds): per flush, each
    session gets one hint with its newest seq, consecutive token deltas of a
    step are merged into one message, and the dashboard gets one hint naming
    every session that moved. That keeps a busy worker's cost per event small
    while adding at most WINDOW to live latency.

    With the Redis pub/sub layer (every deployment with REDIS_URL) a plain
    thread sleeps out the window and sends the batch as one pipelined round of
    PUBLISHes; no event loop is involved, which keeps the cost per flush low
    on a worker appending for hundreds of turns. With the in-memory layer the
    groups live in the ASGI server's own loop, so sends are scheduled there
    instead (the server registers its loop when the first websocket
    connects); with no registered loop nobody in this process can be
    listening, and hints are dropped. Any other layer gets group_send calls
    on a loop of the publisher's own.
    """

    WINDOW = 0.005

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server_loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[uuid.UUID, int] = {}
        self._messages: list[tuple[str, dict[str, Any]]] = []
        self._writes: dict[str, _Write] = {}
        self._scheduled_on: asyncio.AbstractEventLoop | None = None
        self._redis: redis.Redis | None = None
        self._pipe: Any = None  # reused: building a redis-py pipeline copies its callback table
        self._thread: threading.Thread | None = None
        self._armed = False
        self._wake = threading.Event()

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

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Caller holds the lock. A flush scheduled on a loop that has since
        closed (an ASGI server's, or a test's) never runs: schedule anew."""
        scheduled = self._scheduled_on
        if scheduled is loop and not loop.is_closed():
            return
        self._scheduled_on = loop
        loop.call_soon_threadsafe(lambda: loop.call_later(self.WINDOW, lambda: asyncio.ensure_future(self._flush())))

    def _arm(self) -> None:
        """Caller holds the lock: have the Redis thread flush after WINDOW."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="terret-hints", daemon=True)
            self._thread.start()
        if not self._armed:
            self._armed = True
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            threading.Event().wait(self.WINDOW)
            with self._lock:
                self._armed = False
                pending, self._pending = self._pending, {}
                messages, self._messages = self._messages, []
                writes, self._writes = self._writes, {}
            layer = get_channel_layer()
            if isinstance(layer, RedisPubSubChannelLayer):
                try:
                    self._publish_pipelined(layer, self._batch(pending, messages), writes)
                except Exception:  # hints are lossy by design; readers catch up by seq
                    log.warning("%d hints were not sent", len(pending) + len(messages) + len(writes), exc_info=True)
                    self._pipe = None

    def _schedule_any(self) -> bool:
        """Caller holds the lock. Arrange a flush; False if nobody can listen."""
        if isinstance(get_channel_layer(), RedisPubSubChannelLayer):
            self._arm()
            return True
        loop = self._target_loop()
        if loop is None:
            return False
        self._schedule(loop)
        return True

    def event(self, session_id: uuid.UUID, seq: int) -> None:
        with self._lock:
            if self._pending.get(session_id, 0) < seq:
                self._pending[session_id] = seq
            if not self._schedule_any():
                self._pending.pop(session_id, None)

    def write(self, key: str, op: str, text: str = "", ttl: int = 0) -> bool:
        """Queue a best-effort write of a Redis key (log/partial.py's text so
        far) for the next flush, where it goes out ahead of that flush's
        messages, in the same pipelined round trip. A window's writes to one
        key are merged (SET then APPENDs: one SET; anything then DEL: one
        DEL), so a step whose whole reply streams within a window costs one
        command, and the turn's thread waits on Redis for none of them.
        `op`: "set" (with `ttl`), "append", "expire" (`ttl`) or "delete".
        False (nothing queued) unless hints go through Redis pub/sub."""
        with self._lock:
            if not isinstance(get_channel_layer(), RedisPubSubChannelLayer):
                return False
            _merge(self._writes, key, op, text, ttl)
            self._arm()
        return True

    def message(self, group: str, message: dict[str, Any]) -> None:
        with self._lock:
            last = self._messages[-1] if self._messages else None
            if (
                last is not None
                and last[0] == group
                and message.get("type") == "log.delta"
                and last[1].get("type") == "log.delta"
                and last[1].get("step") == message.get("step")
            ):
                last[1]["text"] = last[1].get("text", "") + message.get("text", "")
            else:
                self._messages.append((group, dict(message)))
            if not self._schedule_any():
                self._messages.clear()

    async def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            messages, self._messages = self._messages, []
            self._scheduled_on = None
        layer = get_channel_layer()
        if layer is None:
            return
        for group, message in self._batch(pending, messages):
            try:
                await layer.group_send(group, message)
            except Exception:
                log.warning("message to %s was not sent", group, exc_info=True)

    @staticmethod
    def _batch(
        pending: dict[uuid.UUID, int], messages: list[tuple[str, dict[str, Any]]]
    ) -> list[tuple[str, dict[str, Any]]]:
        # Messages (deltas) first: a step's text precedes the hint for its
        # durable assistant/message. One dashboard hint names every session.
        batch = list(messages)
        batch += [(group_name(sid), {"type": "log.hint", "seq": seq}) for sid, seq in pending.items()]
        if pending:
            batch.append((DASHBOARD_GROUP, {"type": "log.hint", "sessions": [str(s) for s in pending]}))
        return batch

    def _publish_pipelined(
        self,
        layer: RedisPubSubChannelLayer,
        batch: list[tuple[str, dict[str, Any]]],
        writes: dict[str, _Write] | None = None,
    ) -> None:
        """The whole flush as one pipelined round trip: the queued writes,
        then the PUBLISHes, on the channel names and serialization the
        pub/sub layer's subscribers use (`<prefix>__group__<group>`); much
        cheaper than one asyncio group_send per message on a worker running
        hundreds of turns. Writes go first: a step's text so far then never
        lacks a delta a reader was sent (log/partial.py)."""
        if not batch and not writes:
            return
        if self._pipe is None:
            if self._redis is None:
                self._redis = redis.Redis.from_url(settings.REDIS_URL or "")
            self._pipe = self._redis.pipeline(transaction=False)
        prefix = settings.CHANNEL_PREFIX
        pipe = self._pipe
        for key, write in (writes or {}).items():
            write.send(pipe, key)
        for group, message in batch:
            pipe.publish(f"{prefix}__group__{group}", layer.serialize(message))
        pipe.execute()


@dataclass
class _Write:
    """A window's writes to one key, merged: what the key must become."""

    op: str  # "set", "append", "expire" or "delete"
    text: str = ""
    ttl: int = 0  # set: the key's expiry; append or expire: refresh it (0: no)

    def send(self, pipe: Any, key: str) -> None:
        if self.op == "delete":
            pipe.delete(key)
        elif self.op == "set":
            pipe.set(key, self.text, ex=self.ttl or None)
        elif self.op == "append":
            pipe.append(key, self.text)
        if self.op in ("append", "expire") and self.ttl:
            pipe.expire(key, self.ttl)


def _merge(writes: dict[str, _Write], key: str, op: str, text: str, ttl: int) -> None:
    """Fold one more write of `key` into the window's writes."""
    found = writes.get(key)
    if op in ("set", "delete") or found is None:
        writes[key] = _Write(op, text, ttl)  # a SET or DEL replaces whatever the key was
    elif op == "append" and found.op in ("set", "append"):
        found.text += text
    elif op == "expire" and found.op != "delete":
        found.ttl = found.ttl or ttl
    # An append or expire after a DEL in the same window is dropped: a step's
    # text starts with a SET, never with an APPEND.


publisher = _Publisher()


def publish_event(session_id: uuid.UUID, seq: int) -> None:
    publisher.event(session_id, seq)


def publish_delta(session_id: uuid.UUID | str, payload: dict[str, Any]) -> None:
    """Streamed token deltas: live only, never durable."""
    publisher.message(group_name(session_id), {"type": "log.delta", **payload})


def publish_live(session_id: uuid.UUID | str, payload: dict[str, Any]) -> None:
    """Live-only news about the open turn that the log does not keep, such as
    a tool call's progress (`{"kind": "tool/progress", "call_id", "progress",
    "total"?, "message"?}`): sockets forward it as a `live` frame; a client
    that misses one loses nothing durable."""
    publisher.message(group_name(session_id), {"type": "log.live", **payload})
