"""A socket's outbox: bounded in frames and in bytes.

A slow client lets its outbox fill. Bounded in frames only (256), it could
hold 256 frames of up to TERRET_SOCKET_MAX_FRAME_BYTES each, about 256 MiB
per slow socket; bounded in bytes too (TERRET_SOCKET_OUTBOX_BYTES) it never
holds more than that. What happens at the bound is the socket's documented
overflow (docs/protocol.md): a committed event is not queued (the pump
waits, and resumes from its last seq: the log is its queue, so the suffix
that did not fit is read again from the database once there is room), and a
delta or a partial, best-effort by design, is dropped.

Every frame is fitted (live/frames.fit) before it is queued, so none is
larger than the frame limit, and the byte bound (at least one frame, a
setting's check) always admits a frame into an empty outbox.
"""

from __future__ import annotations

import asyncio
from collections import deque

from django.conf import settings

from sessions_app.live import frames


def max_bytes() -> int:
    return int(settings.TERRET_SOCKET_OUTBOX_BYTES)


class Outbox[T]:
    """asyncio.Queue's put / put_nowait / get, bounded by `max_frames` and
    `max_bytes` (a str item's UTF-8 size; anything else counts 0)."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._items: deque[tuple[T, int]] = deque()
        self.nbytes = 0
        self.peak_bytes = 0  # the most it ever held (tests, and the reason for a bound)
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def qsize(self) -> int:
        """The frames it holds (asyncio.Queue's name)."""
        return len(self._items)

    def _room(self, size: int) -> bool:
        if len(self._items) >= self.max_frames:
            return False
        return not self._items or self.nbytes + size <= self.max_bytes

    def put_nowait(self, item: T) -> None:
        size = frames.size(item) if isinstance(item, str) else 0
        if not self._room(size):
            raise asyncio.QueueFull
        self._items.append((item, size))
        self.nbytes += size
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        self._changed.set()

    async def put(self, item: T) -> None:
        """Waits while the outbox has no room for `item`."""
        while True:
            try:
                return self.put_nowait(item)
            except asyncio.QueueFull:
                self._changed.clear()
                await self._changed.wait()

    async def get(self) -> T:
        while not self._items:
            self._changed.clear()
            await self._changed.wait()
        item, size = self._items.popleft()
        self.nbytes -= size
        self._changed.set()
        return item
