"""The chat page's socket: /ws/sessions/<id>/page/?after=<seq>.

The same consumer as the session socket (session.py: the same access
checks, the same catch-up by seq from the database, the same hub), but what
it sends is HTML for htmx's ws extension: each committed event as the chat
template's `event` partial, plus the header, the approvals and the streaming
bubble brought up to date, all as out-of-band swaps (web/present.py renders
them). It takes no frames: the page acts through its forms.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sessions_app.log import reads
from sessions_app.sockets import hub
from sessions_app.sockets.session import SessionConsumer, _in_thread
from sessions_app.web.present import ChatFollower


class ChatPageConsumer(SessionConsumer):
    follower: ChatFollower | None = None

    def hello_frame(self, access: dict[str, Any], last_seq: int) -> str:
        self.follower = ChatFollower(access["session"], self.scope["user"])
        return ""  # nothing to show: the page already shows everything up to ?after=

    def synced_frame(self) -> str:
        return ""

    async def _send_events(self, rows: list[reads.EventFrame]) -> None:
        new = [(seq, text) for seq, text in rows if seq > self.last_sent]
        if not new or self.follower is None:
            return
        html = await _in_thread(self.follower.events, hub.READ_POOL)(new)
        await self.outbox.put(html)  # waits while a slow client's outbox is full
        self.last_sent = new[-1][0]

    def on_delta(self, frame: str) -> None:
        if not self.synced or self.follower is None:
            return
        delta = json.loads(frame)
        html = self.follower.delta(int(delta.get("step") or 0), str(delta.get("text") or ""))
        if not html:
            return
        try:
            self.outbox.put_nowait(html)
        except asyncio.QueueFull:
            self.deltas_dropped += 1  # best-effort by design: assistant/message has the full text

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return  # the page sends nothing on this socket
