"""The operators' console's live socket: /ws/ops/?status=<filter>&sort=<order>.

The dashboard's socket (web/dashboard_socket.py) with another body: it
joins the same hints group, and for each burst of commits (coalesced) it
renders the console's body for this operator, filter and sort again and
sends it as an htmx out-of-band swap; every REFRESH_SECONDS too, since the
"running now" durations move without a commit and hints can be lost.

Staff only, checked on every frame: a user who is no longer an active
staff member (or whose login ended) is refused and the socket closed. The
body's plain forms carry the socket's own CSRF cookie as their token.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from sessions_app import actions
from sessions_app.errors import NotAllowed
from sessions_app.live import frames
from sessions_app.live.auth import live_user
from sessions_app.web.console import console_fragment
from sessions_app.web.dashboard_socket import DashboardConsumer

TOO_LARGE_NOTICE = (
    '<p id="ops-status" role="status" aria-live="polite" hx-swap-oob="true">'
    "The console is too large to update live: reload the page to see it.</p>"
)


def console_frame(
    user_id: Any, token_id: int | None, session_key: str | None, status: str, sort: str, csrf: str
) -> str | None:
    """None: access lost (not signed in, or not an operator any more). Otherwise the body."""
    user = live_user(user_id, token_id, session_key)
    if user is None:
        return None
    try:
        actions.operator(user)
    except NotAllowed:
        return None
    return console_fragment(user, status, sort, csrf)


class ConsoleConsumer(DashboardConsumer):
    refresh_seconds = 5.0  # "running now" shows how long each turn has run: it moves without a commit

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        self.status = (query.get("status") or ["all"])[-1][:32]
        self.sort = (query.get("sort") or ["recent"])[-1][:32]
        self.csrf = str((self.scope.get("cookies") or {}).get("csrftoken", ""))[:64]
        await super().connect()

    async def _send_fragment(self, ids: list[str] | None) -> None:
        render = database_sync_to_async(console_frame)
        html = await render(self.user_id, self.token_id, self.session_key, self.status, self.sort, self.csrf)
        if html is None:
            await self._refuse("you may no longer follow the console", 4403)
        else:
            await self.send_frame(html)

    async def send_frame(self, text: str) -> None:
        await self.send(text_data=frames.fit(text, lambda _text, _n: TOO_LARGE_NOTICE, last_resort=TOO_LARGE_NOTICE))
