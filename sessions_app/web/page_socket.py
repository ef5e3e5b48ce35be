"""The chat page's socket: /ws/sessions/<id>/page/?after=<seq>.

The same follower as the session socket (live/follow.py: the same access
checks, the same catch-up by seq from the database, the same hub), but what
it sends is HTML for htmx's ws extension: each committed event as the chat
template's `event` partial, plus the header, the approvals and the streaming
bubble brought up to date, all as out-of-band swaps (web/present.py renders
them). It takes no frames: the page acts through its forms.

A batch's fragments are fitted and packed into frames of at most
TERRET_SOCKET_MAX_FRAME_BYTES (live/frames.py): a row too large for a
frame goes out with its text cut and a "shown in part" note, and a long
replay goes out as several frames, in order.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from sessions_app.live import frames, hub
from sessions_app.live.follow import Follower, in_thread
from sessions_app.log import reads
from sessions_app.web.present import TOO_LARGE_NOTICE, ChatFollower


class ChatPageConsumer(Follower):
    follower: ChatFollower | None = None

    def hello_frame(self, access: dict[str, Any], state: dict[str, Any]) -> str:
        self.follower = ChatFollower(access["session"], self.scope["user"])
        return ""  # nothing to show: the page already shows everything up to ?after=

    def stand_in(self, text: str, nbytes: int) -> str:
        return TOO_LARGE_NOTICE  # frames are fitted before they are queued; this is the last resort

    async def _send_events(self, rows: list[reads.EventFrame]) -> None:
        new = [(seq, text) for seq, text in rows if seq > self.last_sent]
        if not new or self.follower is None:
            return
        for html in await in_thread(self._frames, hub.READ_POOL)(new):
            await self.outbox.put(html)  # waits while a slow client's outbox is full
        self.last_sent = new[-1][0]

    def _frames(self, new: list[reads.EventFrame]) -> list[str]:
        """The batch's fragments, each fitted into a frame, packed in order."""
        assert self.follower is not None
        cap = frames.limit()
        fitted = [
            frames.fit(f.html, functools.partial(f.stand_in, max_bytes=cap), cap, last_resort=TOO_LARGE_NOTICE)
            for f in self.follower.events(new)
        ]
        return frames.pack(fitted, cap)

    def on_delta(self, frame: str) -> None:
        if not self.synced or self.follower is None:
            return
        if self.held_deltas is not None:
            self.held_deltas.append(frame)  # after the step's text so far (Follower._send_partial)
            return
        delta = json.loads(frame)
        html = self.follower.delta(int(delta.get("step") or 0), str(delta.get("text") or ""))
        if not html:
            return
        try:
            self.outbox.put_nowait(html)
        except asyncio.QueueFull:
            self.deltas_dropped += 1  # best-effort by design: assistant/message has the full text

    def on_partial(self, step: int, text: str) -> None:
        """A reload mid-reply: the streaming bubble starts with the text so far."""
        if self.follower is None or step <= self.follower.closed_step:
            return
        try:
            self.outbox.put_nowait(self.follower.bubble(step, text))
        except asyncio.QueueFull:
            self.deltas_dropped += 1

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return  # the page sends nothing on this socket
