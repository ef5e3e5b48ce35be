"""The reviewer's live queue socket: /ws/approvals/.

Thin on purpose. It joins the "approvals" group, and for every approval
requested or decided anywhere (approvals_app.listeners, after commit) it
sends one small htmx out-of-band element that makes the page GET the queue
fragment again, through the permission-checked view. Hints carry no call
data, and several arriving together are coalesced into one refetch.

Access is checked when connecting and again on every frame either way: a
client frame (this socket takes no commands) and every hint sent. A user who
stops being an active reviewer, signs out or whose token is revoked is
disconnected with 4403.
"""

from __future__ import annotations

import asyncio
import json
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.urls import reverse
from django.utils.html import escape

from approvals_app.listeners import GROUP
from sessions_app.api import auth
from sessions_app.errors import NotAllowed, TerretError
from sessions_app.log import hints
from sessions_app.permissions import is_reviewer

COALESCE_SECONDS = 0.25


class Unauthenticated(TerretError):
    code = "unauthenticated"
    status = 401


def hint_html() -> str:
    """An out-of-band swap whose `load` trigger refetches the queue fragment."""
    url = escape(reverse("approvals:queue_fragment"))
    return (
        f'<div id="approvals-live" hx-swap-oob="true" hidden hx-get="{url}" hx-trigger="load" '
        'hx-target="#approval-queue" hx-swap="outerHTML"></div>'
    )


def _error(exc: TerretError) -> str:
    return json.dumps({"type": "error", "code": exc.code, "message": str(exc)})


def still_allowed(user_id: Any, token_id: int | None, session_key: str | None) -> bool:
    """Is the socket's user still an active reviewer on a live credential?"""
    user = auth.active_user(user_id)
    if user is None or not is_reviewer(user):
        return False
    if token_id is not None and not auth.token_is_live(token_id):
        return False
    if session_key is not None:
        engine = import_module(settings.SESSION_ENGINE)
        return bool(engine.SessionStore().exists(session_key))
    return True


class ApprovalsConsumer(AsyncWebsocketConsumer):
    joined = False
    user_id: Any = None

    async def connect(self) -> None:
        # The in-memory channel layer lives in this loop (embedded mode).
        hints.publisher.register_server_loop(asyncio.get_running_loop())
        self.flush: asyncio.Task[None] | None = None
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

    async def disconnect(self, code: int) -> None:
        if self.flush is not None:
            self.flush.cancel()
        if self.joined:
            await self.channel_layer.group_discard(GROUP, self.channel_name)
            self.joined = False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not await self._allowed():
            return await self._refuse(NotAllowed("you may no longer follow the approval queue"), 4403)
        await self.send(text_data=_error(NotAllowed("this socket only sends hints; decide through the page or API")))

    async def approvals_changed(self, message: dict[str, Any]) -> None:
        """Group handler: schedule one refetch hint for this burst of changes."""
        if self.flush is None or self.flush.done():
            self.flush = asyncio.create_task(self._send_hint())

    async def _send_hint(self) -> None:
        await asyncio.sleep(COALESCE_SECONDS)
        if not await self._allowed():
            await self._refuse(NotAllowed("you may no longer follow the approval queue"), 4403)
            return
        await self.send(text_data=hint_html())

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
