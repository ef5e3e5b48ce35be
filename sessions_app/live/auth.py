"""Who is on the other end of a websocket.

Two ways in:
- a bearer token, as `?token=` or `Authorization: Bearer` on the upgrade
  request (programs): the token's user, with `scope["api_token_id"]` set so
  the consumer can notice a revocation later. No origin check: a token is not
  an ambient credential a foreign page could ride, and programs usually send
  no Origin header at all.
- otherwise the session cookie (the web page), behind channels'
  AllowedHostsOriginValidator, which refuses cross-site upgrades.

A token that names no live token yields AnonymousUser; the consumer then
refuses the socket with close code 4401. It never falls back to the cookie.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from sessions_app.services.tokens import active_user, authenticate_token, token_is_live


def token_from_scope(scope: dict[str, Any]) -> str | None:
    query = parse_qs(scope.get("query_string", b"").decode("latin1"))
    if query.get("token"):
        return query["token"][-1]
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credential = value.decode("latin1").partition(" ")
            if scheme.lower() == "bearer" and credential.strip():
                return credential.strip()
    return None


class TokenAuthMiddleware:
    def __init__(self, inner: Any) -> None:
        self.token_app = inner
        self.cookie_app = AllowedHostsOriginValidator(AuthMiddlewareStack(inner))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        raw = token_from_scope(scope)
        if raw is None:
            return await self.cookie_app(scope, receive, send)
        token = await database_sync_to_async(authenticate_token)(raw)
        scope = {
            **scope,
            "user": token.user if token is not None else AnonymousUser(),
            "api_token_id": token.pk if token is not None else None,
        }
        return await self.token_app(scope, receive, send)


def SocketAuthStack(inner: Any) -> TokenAuthMiddleware:  # named like channels' AuthMiddlewareStack
    return TokenAuthMiddleware(inner)


def live_user(user_id: Any, token_id: int | None, session_key: str | None) -> Any:
    """The socket's user if still active on a live credential (the token not
    revoked, the login session not ended), else None. Every socket asks this
    again before it acts or sends, so a revocation takes effect at once."""
    user = active_user(user_id)
    if user is None:
        return None
    if token_id is not None and not token_is_live(token_id):
        return None
    if session_key is not None and not import_module(settings.SESSION_ENGINE).SessionStore().exists(session_key):
        return None
    return user
