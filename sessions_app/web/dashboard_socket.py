"""The dashboard's live socket: /ws/dashboard/?page=<n>.

It joins hints.DASHBOARD_GROUP, where each burst of commits sends {"sessions": [ids]}.
Hints carry no data: for a burst of them (coalesced over COALESCE_SECONDS)
that names a session the user may view, it renders the dashboard body again
for this user and page and sends it as an htmx out-of-band swap
(web/dashboard.dashboard_fragment), and it does so every REFRESH_SECONDS
too, since hints can be lost.

A body larger than a socket frame may carry is never sent: a notice to
reload goes instead (send_frame, live/frames.py).

Permissions are checked on every frame either way: before each fragment goes
out the user must still be active (and their login session or token still
live); a client frame is refused (this socket takes no commands) after the
same check.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from sessions_app import actions
from sessions_app.live import frames
from sessions_app.live.auth import live_user
from sessions_app.log import hints
from sessions_app.models import Session
from sessions_app.web.dashboard import TOO_LARGE_NOTICE, dashboard_fragment

COALESCE_SECONDS = 0.5
REFRESH_SECONDS = 30.0
MAX_TRACKED = 500


def fragment_for(
    user_id: Any, token_id: int | None, session_key: str | None, session_ids: list[str] | None, page: str | None
) -> str | None:
    """None: access lost. "": none of the hinted sessions is the user's to
    see. Otherwise the dashboard body for this user and page. With
    `session_ids` None (the periodic refresh) the body is always rendered."""
    user = live_user(user_id, token_id, session_key)
    if user is None:
        return None
    if session_ids is not None:
        visible = actions.visible(user, Session.objects.filter(id__in=session_ids))
        if not session_ids or not visible.exists():
            return ""
    return dashboard_fragment(user, page)


class DashboardConsumer(AsyncWebsocketConsumer):
    refresh_seconds = REFRESH_SECONDS  # the console's socket (web/console_socket.py) refreshes more often
    joined = False
    user_id: Any = None

    async def connect(self) -> None:
        # The in-memory channel layer lives in this loop (embedded mode).
        hints.publisher.register_server_loop(asyncio.get_running_loop())
        self.flush: asyncio.Task[None] | None = None
        self.refresh: asyncio.Task[None] | None = None
        self.hinted: set[str] = set()
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return await self._refuse("sign in to follow the dashboard", 4401)
        self.user_id = user.pk
        self.token_id: int | None = self.scope.get("api_token_id")
        session = self.scope.get("session")
        self.session_key: str | None = getattr(session, "session_key", None) if self.token_id is None else None
        pages = parse_qs(self.scope.get("query_string", b"").decode("latin1")).get("page")
        self.page = pages[-1][:12] if pages else None
        await self.channel_layer.group_add(hints.DASHBOARD_GROUP, self.channel_name)
        self.joined = True
        self.refresh = asyncio.create_task(self._refresh_every())

    async def disconnect(self, code: int) -> None:
        for task in (self.flush, self.refresh):
            if task is not None:
                task.cancel()
        if self.joined:
            await self.channel_layer.group_discard(hints.DASHBOARD_GROUP, self.channel_name)
            self.joined = False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        check = database_sync_to_async(live_user)
        if await check(self.user_id, self.token_id, self.session_key) is None:
            return await self._refuse("you may no longer follow the dashboard", 4403)
        await self.send(
            text_data=json.dumps({"type": "error", "code": "not_allowed", "message": "this socket takes no frames"})
        )

    async def log_hint(self, message: dict[str, Any]) -> None:
        """Group handler: note the session; one fragment per burst."""
        for sid in message.get("sessions") or [message.get("session", "")]:
            if len(self.hinted) >= MAX_TRACKED:
                break
            self.hinted.add(str(sid))
        if self.flush is None or self.flush.done():
            self.flush = asyncio.create_task(self._send_burst())

    async def _send_burst(self) -> None:
        await asyncio.sleep(COALESCE_SECONDS)
        ids, self.hinted = [i for i in self.hinted if i], set()
        await self._send_fragment(ids)

    async def _refresh_every(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_seconds)
            await self._send_fragment(None)

    async def _send_fragment(self, ids: list[str] | None) -> None:
        render = database_sync_to_async(fragment_for)
        html = await render(self.user_id, self.token_id, self.session_key, ids, self.page)
        if html is None:
            await self._refuse("you may no longer follow the dashboard", 4403)
        elif html:
            await self.send_frame(html)

    async def send_frame(self, text: str) -> None:
        """Every fragment this socket sends: one larger than a socket frame may
        carry (sockets/frames.py) is replaced by a notice to reload."""
        notice = TOO_LARGE_NOTICE
        await self.send(text_data=frames.fit(text, lambda _text, _n: notice, last_resort=notice))

    async def _refuse(self, text: str, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(hints.DASHBOARD_GROUP, self.channel_name)
            self.joined = False
        await self.send(text_data=json.dumps({"type": "error", "code": "not_allowed", "message": text}))
        await self.close(code=code)
