"""The dashboard's live socket: /ws/dashboard/.

It joins hints.DASHBOARD_GROUP, where each burst of commits sends {"sessions": [ids]}.
Hints carry no data: for a burst of them (coalesced over COALESCE_SECONDS) it
sends one small htmx out-of-band element whose `load` trigger makes the page
GET the dashboard body again through the permission-checked view.

Permissions are checked on every frame either way: before each hint goes out
the user must still be active (and their login session or token still live)
and at least one hinted session must be one they may view; a client frame is
refused (this socket takes no commands) after the same check.
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

from sessions_app import permissions
from sessions_app.api import auth
from sessions_app.log import hints
from sessions_app.models import Session

COALESCE_SECONDS = 0.5
MAX_TRACKED = 500


def hint_html() -> str:
    """An out-of-band swap whose `load` trigger refetches the dashboard body."""
    url = escape(reverse("dashboard:index"))
    return (
        f'<div id="dashboard-live" hx-swap-oob="true" hidden hx-get="{url}" hx-trigger="load" '
        'hx-target="#dashboard-body" hx-swap="outerHTML" hx-include="#dashboard-page"></div>'
    )


def user_may_follow(user_id: Any, token_id: int | None, session_key: str | None) -> Any:
    """The socket's user if still active on a live credential, else None."""
    user = auth.active_user(user_id)
    if user is None:
        return None
    if token_id is not None and not auth.token_is_live(token_id):
        return None
    if session_key is not None:
        engine = import_module(settings.SESSION_ENGINE)
        if not engine.SessionStore().exists(session_key):
            return None
    return user


def sees_any(user_id: Any, token_id: int | None, session_key: str | None, session_ids: list[str]) -> bool | None:
    """None: access lost. Otherwise whether any hinted session is visible to the user."""
    user = user_may_follow(user_id, token_id, session_key)
    if user is None:
        return None
    if not session_ids:
        return False
    visible = permissions.visible_sessions(user, Session.objects.filter(id__in=session_ids))
    return bool(visible.exists())


class DashboardConsumer(AsyncWebsocketConsumer):
    joined = False
    user_id: Any = None

    async def connect(self) -> None:
        # The in-memory channel layer lives in this loop (embedded mode).
        hints.publisher.register_server_loop(asyncio.get_running_loop())
        self.flush: asyncio.Task[None] | None = None
        self.hinted: set[str] = set()
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return await self._refuse("sign in to follow the dashboard", 4401)
        self.user_id = user.pk
        self.token_id: int | None = self.scope.get("api_token_id")
        session = self.scope.get("session")
        self.session_key: str | None = getattr(session, "session_key", None) if self.token_id is None else None
        await self.channel_layer.group_add(hints.DASHBOARD_GROUP, self.channel_name)
        self.joined = True

    async def disconnect(self, code: int) -> None:
        if self.flush is not None:
            self.flush.cancel()
        if self.joined:
            await self.channel_layer.group_discard(hints.DASHBOARD_GROUP, self.channel_name)
            self.joined = False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        check = database_sync_to_async(user_may_follow)
        if await check(self.user_id, self.token_id, self.session_key) is None:
            return await self._refuse("you may no longer follow the dashboard", 4403)
        await self.send(
            text_data=json.dumps({"type": "error", "code": "not_allowed", "message": "this socket only sends hints"})
        )

    async def log_hint(self, message: dict[str, Any]) -> None:
        """Group handler: note the session; one refetch per burst."""
        for sid in message.get("sessions") or [message.get("session", "")]:
            if len(self.hinted) >= MAX_TRACKED:
                break
            self.hinted.add(str(sid))
        if self.flush is None or self.flush.done():
            self.flush = asyncio.create_task(self._send_hint())

    async def _send_hint(self) -> None:
        await asyncio.sleep(COALESCE_SECONDS)
        ids, self.hinted = [i for i in self.hinted if i], set()
        check = database_sync_to_async(sees_any)
        allowed = await check(self.user_id, self.token_id, self.session_key, ids)
        if allowed is None:
            await self._refuse("you may no longer follow the dashboard", 4403)
        elif allowed:
            await self.send(text_data=hint_html())

    async def _refuse(self, text: str, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(hints.DASHBOARD_GROUP, self.channel_name)
            self.joined = False
        await self.send(text_data=json.dumps({"type": "error", "code": "not_allowed", "message": text}))
        await self.close(code=code)
