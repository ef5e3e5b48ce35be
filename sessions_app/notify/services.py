"""A person's notification settings, written on their behalf.

The webhook secret is write-only: it is stored (the sender signs with it) but
every read shows it masked (`mask`), and it is never written to a log or an
error. Putting the mask back (a client that read, changed another field and
wrote the whole object) keeps the secret.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from sessions_app import outbound
from sessions_app.errors import InvalidInput
from sessions_app.models import PersonNotifications
from sessions_app.validation import clean_text

MIN_SECRET_CHARS = 16
MAX_SECRET_CHARS = 200
MASK = "••••••••"


def mask(secret: str) -> str | None:
    """What a read shows of a secret: never more than its last four characters."""
    return f"{MASK}{secret[-4:]}" if secret else None


def settings_of(user: Any) -> dict[str, Any]:
    found = PersonNotifications.objects.filter(user=user).first() or PersonNotifications(user=user)
    return {
        "email": found.email,
        "email_address": user.email or None,
        "webhook_url": found.webhook_url or None,
        "webhook_secret": mask(found.webhook_secret),
    }


def set_settings(user: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Change what `values` names (email, webhook_url, webhook_secret; a
    missing one is kept). A webhook URL is checked against server-side
    request forgery and needs a secret; an empty or null URL removes the
    webhook and its secret. Bad input changes nothing (InvalidInput)."""
    row = PersonNotifications.objects.filter(user=user).first() or PersonNotifications(user=user)
    if "email" in values:
        if not isinstance(values["email"], bool):
            raise InvalidInput("email must be true or false")
        row.email = values["email"]
    if "webhook_url" in values:
        row.webhook_url = _url(values["webhook_url"])
        if not row.webhook_url:
            row.webhook_secret = ""
    if values.get("webhook_secret") is not None and values["webhook_secret"] != mask(row.webhook_secret):
        row.webhook_secret = _secret(values["webhook_secret"])
    if row.webhook_url and not row.webhook_secret:
        raise InvalidInput(f"a webhook needs a secret ({MIN_SECRET_CHARS} characters at least) to sign with")
    if row.webhook_secret and not row.webhook_url:
        row.webhook_secret = ""  # a secret without a webhook is kept nowhere
    row.updated_at = timezone.now()
    row.save()
    return settings_of(user)


def _url(value: Any) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise InvalidInput("webhook_url must be a string or null")
    return outbound.check_url(clean_text("webhook_url", value)).url


def _secret(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidInput("webhook_secret must be a string or null")
    secret = clean_text("webhook_secret", value)
    if not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
        raise InvalidInput(f"webhook_secret must have {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} characters")
    return secret
