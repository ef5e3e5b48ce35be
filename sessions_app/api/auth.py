"""Bearer tokens for programs, and the two ways an API request authenticates.

A token is `trt_` + 43 url-safe characters, shown once when it is issued.
Only its SHA-256 is stored (a token has 256 bits of entropy, so a fast hash
is enough: there is nothing to brute-force). Lookup goes by the stored
12-character prefix and the hashes are compared in constant time, so the
database index never becomes a timing oracle on the secret part.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from sessions_app.api.errors import CsrfFailed, Unauthenticated
from sessions_app.models import ApiToken
from sessions_app.validation import clean_text

TOKEN_PREFIX = "trt_"  # noqa: S105 - a public marker, not a secret
PREFIX_LEN = 12
MAX_TOKEN_CHARS = 200
# last_used_at is for people auditing tokens; minute resolution keeps every
# request from turning into a write.
LAST_USED_RESOLUTION = timedelta(seconds=60)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def issue_token(user: Any, name: str = "") -> tuple[ApiToken, str]:
    """Create a token for `user`. Returns the row and the token itself, which
    is not stored anywhere and cannot be recovered later."""
    name = clean_text("a token name", name)  # InvalidInput before the row: its column cannot hold NUL
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name[:100], prefix=raw[:PREFIX_LEN], key_hash=hash_token(raw))
    return token, raw


def authenticate_token(raw: Any) -> ApiToken | None:
    """The live token `raw` names (not revoked, active user), or None."""
    if not isinstance(raw, str) or not raw.startswith(TOKEN_PREFIX) or len(raw) > MAX_TOKEN_CHARS:
        return None
    digest = hash_token(raw)
    found: ApiToken | None = None
    candidates = ApiToken.objects.select_related("user").filter(prefix=raw[:PREFIX_LEN], revoked_at__isnull=True)
    for candidate in candidates:
        # Look at every candidate so the time taken does not say which matched.
        if hmac.compare_digest(candidate.key_hash, digest):
            found = candidate
    if found is None or not found.user.is_active:
        return None
    _touch(found)
    return found


def _touch(token: ApiToken) -> None:
    now = timezone.now()
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
    ApiToken.objects.filter(stale, pk=token.pk).update(last_used_at=now)


def token_is_live(token_id: int) -> bool:
    return ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True, user__is_active=True).exists()


def revoke(tokens: QuerySet[ApiToken]) -> int:
    """Revoke every token in `tokens` that is still live. Returns how many."""
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


def active_user(user_id: Any) -> Any:
    return get_user_model().objects.filter(pk=user_id, is_active=True).first()


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
