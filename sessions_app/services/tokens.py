"""API tokens on behalf of their user (the settings page): create one, shown
once, and revoke it.

The token format and its hash are the API's (sessions_app/api/auth.py, which
authenticates them): `trt_` + 43 url-safe characters, stored as its SHA-256
with the first 12 characters kept for lookup. Services sit below the API in
the layers, so the few lines that mint one are here, and the API's tests and
this module's check that the API accepts what this mints.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.utils import timezone

from sessions_app.errors import InvalidInput
from sessions_app.models import ApiToken
from sessions_app.validation import clean_text

TOKEN_PREFIX = "trt_"  # noqa: S105 - a public marker, not a secret
PREFIX_LEN = 12
MAX_NAME_CHARS = 100
# A user with more live tokens than this is asked to revoke some first.
MAX_LIVE_TOKENS = 50


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(user: Any, name: str) -> tuple[ApiToken, str]:
    """A new token for `user`, named `name`. Returns the row and the token
    itself, which is not stored and cannot be shown again."""
    if not getattr(user, "is_active", False):
        raise InvalidInput("an inactive user's tokens would not work")
    label = " ".join(clean_text("a token name", str(name or "")).split())
    if not label:
        raise InvalidInput("give the token a name, e.g. 'laptop' or 'ci bot'")
    if len(label) > MAX_NAME_CHARS:
        raise InvalidInput(f"a token name has at most {MAX_NAME_CHARS} characters")
    if live_tokens(user).count() >= MAX_LIVE_TOKENS:
        raise InvalidInput(f"you have {MAX_LIVE_TOKENS} live tokens: revoke one first")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=label, prefix=raw[:PREFIX_LEN], key_hash=_hash(raw))
    return token, raw


def revoke_token(user: Any, token_id: int | str) -> ApiToken:
    """Revoke one of `user`'s own tokens. Another user's token, or none, is
    InvalidInput (the same answer, so ids cannot be probed); revoking a
    revoked token changes nothing."""
    try:
        pk = int(token_id)
    except (TypeError, ValueError):
        raise InvalidInput("no such token") from None
    token = ApiToken.objects.filter(pk=pk, user=user).first()
    if token is None:
        raise InvalidInput("no such token")
    if token.revoked_at is None:
        ApiToken.objects.filter(pk=pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        token.refresh_from_db()
    return token


def live_tokens(user: Any) -> Any:
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True)


def tokens_of(user: Any) -> Any:
    """The user's tokens, newest first, revoked ones included (greyed on the page)."""
    return ApiToken.objects.filter(user=user).order_by("-created_at")
