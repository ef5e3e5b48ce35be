"""API tokens: the one module that mints, hashes, verifies and revokes them,
for every door (the API's bearer and the socket's `?token=`, /lg/, the
settings page, `manage.py create_api_token`, the admin).

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

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django.utils import timezone

from sessions_app.errors import InvalidInput
from sessions_app.models import ApiToken
from sessions_app.validation import clean_text

TOKEN_PREFIX = "trt_"  # noqa: S105 - a public marker, not a secret
PREFIX_LEN = 12
MAX_TOKEN_CHARS = 200
MAX_NAME_CHARS = 100
# A user with more live tokens than this is asked to revoke some first.
MAX_LIVE_TOKENS = 50
# last_used_at is for people auditing tokens; minute resolution keeps every
# request from turning into a write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def issue_token(user: Any, name: str = "api") -> tuple[ApiToken, str]:
    """A new token for `user`, named `name`: the one way a token is minted,
    with the same rules on every door. Returns the row and the token itself,
    which is not stored and cannot be shown again."""
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
    token = ApiToken.objects.create(user=user, name=label, prefix=raw[:PREFIX_LEN], key_hash=hash_token(raw))
    return token, raw


# The settings page's name for the same mint.
create_token = issue_token


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


def active_user(user_id: Any) -> Any:
    return get_user_model().objects.filter(pk=user_id, is_active=True).first()


def revoke(tokens: QuerySet[ApiToken]) -> int:
    """Revoke every token in `tokens` that is still live (the admin). Returns how many."""
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


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
