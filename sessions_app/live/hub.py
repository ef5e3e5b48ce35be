"""The sockets' fan-out hub: hints in, frames out.

Frames come from reads.event_frames, built from the stored JSON text
without parsing it. `FrameCache` keeps each watched session's newest frames per event loop.
Events are immutable and committed seqs are gapless, so a cached frame is
never stale: when 50 sockets watch one session, a commit hint costs one
database read, not 50. `Hub` likewise receives each hint once per process
and hands it to every local socket of the session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from sessions_app.live.frames import size as frame_size
from sessions_app.log import hints
from sessions_app.log.reads import PAGE, EventFrame, Page, event_frames, more_follow, read_max_bytes

logger = logging.getLogger(__name__)

TAIL_MAX = 512

# Socket reads run on their own small pool, not asgiref's single
# thread-sensitive thread: one slow query must not queue every socket's reads,
# and a long action (a compaction's model call) must not hold up reads.
READ_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="terret-ws-read")


aread_frames = database_sync_to_async(event_frames, thread_sensitive=False, executor=READ_POOL)


@dataclass
class _Tail:
    """The newest frames of one session, contiguous by seq."""

    frames: list[EventFrame] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # each frame's UTF-8 size
    nbytes: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    watchers: int = 0

    def serve(self, after: int, target: int) -> list[EventFrame] | None:
        """Frames after `after`, if this tail holds every seq up to `target`."""
        if not self.frames:
            return None
        first, last = self.frames[0][0], self.frames[-1][0]
        if after + 1 < first or target > last:
            return None
        start = after + 1 - first
        out = Page()
        budget, total = read_max_bytes(), 0
        for frame in self.frames[start : start + PAGE]:
            total += len(frame[1])
            if out and total > budget:
                out.cut = True  # bounded in bytes like a database read (log/reads.py)
                break
            out.append(frame)
        return out

    def merge(self, after: int, rows: list[EventFrame], *, complete: bool) -> None:
        """Fold in a page read from the database (seqs after+1.. in order).
        `complete`: the page reached the log head when it was read.
        Bounded in frames (TAIL_MAX) and bytes (TERRET_SOCKET_TAIL_BYTES):
        the oldest go first, and a socket behind the tail reads the database."""
        if not rows:
            return
        last = self.frames[-1][0] if self.frames else None
        if last is not None and after <= last < rows[-1][0]:
            new = [r for r in rows if r[0] > last]
            self.frames.extend(new)
            self.sizes.extend(frame_size(r[1]) for r in new)
        elif (last is None or after > last) and complete:
            self.frames = rows[-TAIL_MAX:]
            self.sizes = [frame_size(r[1]) for r in self.frames]
        else:
            return
        self.nbytes = sum(self.sizes)
        cut = 0
        bound = settings.TERRET_SOCKET_TAIL_BYTES
        while len(self.frames) - cut > 1 and (len(self.frames) - cut > TAIL_MAX or self.nbytes > bound):
            self.nbytes -= self.sizes[cut]
            cut += 1
        if cut:
            del self.frames[:cut]
            del self.sizes[:cut]


class FrameCache:
    """Per event loop (asyncio locks belong to one loop)."""

    def __init__(self) -> None:
        self._tails: dict[uuid.UUID, _Tail] = {}

    def watch(self, session_id: uuid.UUID) -> None:
        self._tails.setdefault(session_id, _Tail()).watchers += 1

    def unwatch(self, session_id: uuid.UUID) -> None:
        tail = self._tails.get(session_id)
        if tail is None:
            return
        tail.watchers -= 1
        if tail.watchers <= 0:
            del self._tails[session_id]

    async def read(self, session_id: uuid.UUID, after: int, limit: int = PAGE) -> list[EventFrame]:
        """A database read; what it finds at the head is kept for the others."""
        rows = await aread_frames(session_id, after, limit)
        tail = self._tails.get(session_id)
        if tail is not None:
            tail.merge(after, rows, complete=not more_follow(rows, limit))
        return rows

    async def live(self, session_id: uuid.UUID, after: int, target: int) -> list[EventFrame]:
        """Frames after `after` when a hint said the log reaches `target`.
        Concurrent readers of one session wait for a single database read."""
        tail = self._tails.get(session_id)
        if tail is None:
            return await self.read(session_id, after)
        hit = tail.serve(after, target)
        if hit is not None:
            return hit
        if tail.frames and after + 1 < tail.frames[0][0]:
            return await self.read(session_id, after)  # far behind the head: its own read, queued behind no one
        async with tail.lock:
            hit = tail.serve(after, target)
            if hit is not None:
                return hit
            return await self.read(session_id, after)


class Subscriber(Protocol):
    def on_hint(self, seq: int) -> None: ...

    def on_delta(self, frame: str) -> None: ...


@dataclass
class _Watch:
    subscribers: set[Subscriber] = field(default_factory=set)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    channel: str | None = None
    task: asyncio.Task[None] | None = None
    failed: bool = False


class Hub:
    """One channel-layer subscription per watched session per event loop,
    fanned out in memory to the loop's sockets. With 50 sockets on a session
    a commit hint is one channel-layer message to this process, not 50.

    Handlers only note news (on_hint / on_delta are synchronous and O(1));
    the sockets read the events themselves.
    """

    # channels_redis forgets group members after a day; a long watch rejoins.
    REJOIN_SECONDS = 3600.0

    def __init__(self) -> None:
        self._watches: dict[uuid.UUID, _Watch] = {}

    async def subscribe(self, session_id: uuid.UUID, subscriber: Subscriber) -> None:
        """Returns once hints for the session are being received."""
        watch = self._watches.get(session_id)
        if watch is not None:
            watch.subscribers.add(subscriber)
            await watch.ready.wait()
            if watch.failed:
                watch.subscribers.discard(subscriber)
                raise RuntimeError(f"could not subscribe to hints for session {session_id}")
            return
        watch = self._watches[session_id] = _Watch({subscriber})
        try:
            layer = get_channel_layer()
            assert layer is not None
            watch.channel = await layer.new_channel()
            await layer.group_add(hints.group_name(session_id), watch.channel)
        except BaseException:
            # Never leave a half-made watch behind: later sockets would wait on it.
            if self._watches.get(session_id) is watch:
                del self._watches[session_id]
            watch.failed = True
            watch.ready.set()
            raise
        watch.task = asyncio.create_task(self._listen(session_id, watch))
        watch.ready.set()
        if not watch.subscribers:  # every subscriber left while we were joining
            await self._close(session_id, watch)

    async def unsubscribe(self, session_id: uuid.UUID, subscriber: Subscriber) -> None:
        watch = self._watches.get(session_id)
        if watch is None:
            return
        watch.subscribers.discard(subscriber)
        if not watch.subscribers and watch.ready.is_set():
            await self._close(session_id, watch)

    async def _close(self, session_id: uuid.UUID, watch: _Watch) -> None:
        if self._watches.get(session_id) is watch:
            del self._watches[session_id]
        if watch.task is not None:
            watch.task.cancel()
        layer = get_channel_layer()
        if layer is not None and watch.channel is not None:
            await layer.group_discard(hints.group_name(session_id), watch.channel)

    async def _listen(self, session_id: uuid.UUID, watch: _Watch) -> None:
        layer = get_channel_layer()
        assert layer is not None and watch.channel is not None
        group = hints.group_name(session_id)
        rejoin_at = asyncio.get_running_loop().time() + self.REJOIN_SECONDS
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(watch.channel), self.REJOIN_SECONDS)
            except TimeoutError:
                message = None
            except asyncio.CancelledError:
                raise
            except Exception:
                # A layer hiccup (Redis restart): the sockets' polls cover the
                # gap; listen again shortly.
                logger.warning("hint subscription for %s failed; retrying", session_id, exc_info=True)
                await asyncio.sleep(1.0)
                message = None
            if asyncio.get_running_loop().time() >= rejoin_at:
                await layer.group_add(group, watch.channel)
                rejoin_at = asyncio.get_running_loop().time() + self.REJOIN_SECONDS
            if message is not None:
                self._dispatch(watch, message)

    @staticmethod
    def _dispatch(watch: _Watch, message: dict[str, Any]) -> None:
        if message.get("type") == "log.hint" and isinstance(message.get("seq"), int):
            for subscriber in list(watch.subscribers):
                subscriber.on_hint(message["seq"])
        elif message.get("type") == "log.delta":
            frame = json.dumps({"type": "delta", "step": message.get("step"), "text": message.get("text", "")})
            for subscriber in list(watch.subscribers):
                subscriber.on_delta(frame)
        elif message.get("type") == "log.live":
            # Live-only news (a tool call's progress): for subscribers that show it.
            frame = json.dumps({**message, "type": "live"})
            for subscriber in list(watch.subscribers):
                on_live = getattr(subscriber, "on_live", None)
                if on_live is not None:
                    on_live(frame)


_caches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FrameCache] = weakref.WeakKeyDictionary()
_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def frame_cache() -> FrameCache:
    loop = asyncio.get_running_loop()
    cache = _caches.get(loop)
    if cache is None:
        cache = _caches[loop] = FrameCache()
    return cache


def process_hub() -> Hub:
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub()
    return found
