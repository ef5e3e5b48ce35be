"""The reviewer's live queue socket: /ws/approvals/.

Thin on purpose. It joins the "approvals" group, and for every approval
requested or decided anywhere (approvals_app.listeners, after commit) it
renders the reviewer's queue again for this user and sends it as an htmx
out-of-band swap (`queue_fragment`); several changes arriving
together are coalesced into one, and it refreshes every REFRESH_SECONDS too,
since hints can be lost. Hints carry no call data.

With `?count=1` it sends `{"type": "pending", "count": N}` instead (on
connect, then on the same hints and refreshes): the navigation bar's live
count on every page (static/js/terret-approvals.js).

Access is checked when connecting and again on every frame either way: a
client frame (this socket takes no commands) and every hint sent. A user who
stops being an active reviewer, signs out or whose token is revoked is
disconnected with 4403.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from approvals_app.listeners import GROUP
from approvals_app.selectors import pending_count, queue_for
from sessions_app import actions
from sessions_app.errors import NotAllowed, TerretError, Unauthenticated
from sessions_app.live.auth import live_user
from sessions_app.log import hints

COALESCE_SECONDS = 0.25
REFRESH_SECONDS = 60.0


def queue_fragment(user: Any) -> str:
    """The reviewer's queue, as an out-of-band swap for the live page."""
    return render_to_string("approvals/queue.html#queue", {"queue": queue_for(user), "oob": True})


def still_allowed(user_id: Any, token_id: int | None, session_key: str | None) -> bool:
    """Is the socket's user still an active reviewer on a live credential?"""
    user = live_user(user_id, token_id, session_key)
    return user is not None and actions.reviews(user)


def queue_for_user(user_id: Any, token_id: int | None, session_key: str | None) -> str | None:
    """The queue fragment, or None when the user may no longer follow it."""
    user = live_user(user_id, token_id, session_key)
    if user is None or not actions.reviews(user):
        return None
    return queue_fragment(user)


def count_for_user(user_id: Any, token_id: int | None, session_key: str | None) -> str | None:
    """The count frame, or None when the user may no longer follow the queue."""
    user = live_user(user_id, token_id, session_key)
    if user is None or not actions.reviews(user):
        return None
    return json.dumps({"type": "pending", "count": pending_count(user)})


def _error(exc: TerretError) -> str:
    return json.dumps({"type": "error", "code": exc.code, "message": str(exc)})


class ApprovalsConsumer(AsyncWebsocketConsumer):
    joined = False
    user_id: Any = None

    async def connect(self) -> None:
        # The in-memory channel layer lives in this loop (embedded mode).
        hints.publisher.register_server_loop(asyncio.get_running_loop())
        self.flush: asyncio.Task[None] | None = None
        self.refresh: asyncio.Task[None] | None = None
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.count_only = query.get("count") == ["1"]
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return await self._refuse(Unauthenticated("sign in to follow the approval queue"), 4401)
        self.user_id = user.pk
        self.token_id: int | None = self.scope.get("api_token_id")
        session = self.scope.get("session")
        self.session_key: str | None = getattr(session, "session_key", None) if self.token_id is None else None
        if not await self._allowed():
            return await self._refuse(NotAllowed("the approval queue needs the approve permission"), 4403)
        await self.channel_layer.group_add(GROUP, self.channel_name)
        self.joined = True
        self.refresh = asyncio.create_task(self._refresh_every())
        if self.count_only:
            await self._send_queue()  # the count may have moved since the page was rendered

    async def disconnect(self, code: int) -> None:
        for task in (self.flush, getattr(self, "refresh", None)):
            if task is not None:
                task.cancel()
        if self.joined:
            await self.channel_layer.group_discard(GROUP, self.channel_name)
            self.joined = False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not await self._allowed():
            return await self._refuse(NotAllowed("you may no longer follow the approval queue"), 4403)
        await self.send(text_data=_error(NotAllowed("this socket takes no frames; decide through the page or API")))

    async def approvals_changed(self, message: dict[str, Any]) -> None:
        """Group handler: schedule one fragment for this burst of changes."""
        if self.flush is None or self.flush.done():
            self.flush = asyncio.create_task(self._send_burst())

    async def _send_burst(self) -> None:
        await asyncio.sleep(COALESCE_SECONDS)
        await self._send_queue()

    async def _refresh_every(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            await self._send_queue()

    async def _send_queue(self) -> None:
        render = count_for_user if self.count_only else queue_for_user
        html = await database_sync_to_async(render)(self.user_id, self.token_id, self.session_key)
        if html is None:
            await self._refuse(NotAllowed("you may no longer follow the approval queue"), 4403)
            return
        await self.send(text_data=html)

    async def _allowed(self) -> bool:
        if self.user_id is None:
            return False
        fn = database_sync_to_async(still_allowed)
        return bool(await fn(self.user_id, self.token_id, self.session_key))

    async def _refuse(self, exc: TerretError, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(GROUP, self.channel_name)
            self.joined = False
        await self.send(text_data=_error(exc))
        await self.close(code=code)
