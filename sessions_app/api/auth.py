"""The two ways an API request authenticates: a bearer token (minted,
hashed and verified by services/tokens.py, the one token module of every
door) or the signed-in user's session cookie."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from sessions_app.errors import CsrfFailed, Unauthenticated
from sessions_app.services.tokens import authenticate_token

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


# ---------------------------------------------------------------- django-ninja


class BearerAuth(HttpBearer):
    """`Authorization: Bearer <token>`. A bearer header that names no live
    token is refused outright rather than falling back to the cookie."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = authenticate_token(token)
        if found is None:
            raise Unauthenticated("the bearer token is invalid or revoked")
        request.api_token = found  # type: ignore[attr-defined]
        return found.user


class CookieAuth(APIKeyCookie):
    """The Django session cookie of a signed-in user. Unsafe methods must pass
    Django's CSRF check (ninja marks its views csrf_exempt for the middleware,
    so the check happens here, and only for cookie-authenticated requests)."""

    param_name = "sessionid"

    def __init__(self) -> None:
        self.param_name = settings.SESSION_COOKIE_NAME
        super().__init__(csrf=False)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or not user.is_active:
            return None
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise CsrfFailed("CSRF check failed: send the X-CSRFToken header with cookie authentication")
        return user
