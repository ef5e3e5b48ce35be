"""Notifications: the signed-in person's own settings (no session involved)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessions_app.errors import Unauthenticated
from sessions_app.notify import services as notify_services


@dataclass(frozen=True)
class Notifications:
    """How a person is told: email on or off (to `email_address`), and a
    webhook URL with its secret, masked (the secret is write-only)."""

    email: bool
    email_address: str | None
    webhook_url: str | None
    webhook_secret: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "email": self.email,
            "email_address": self.email_address,
            "webhook_url": self.webhook_url,
            "webhook_secret": self.webhook_secret,
        }


def _person(user: Any) -> Any:
    if not (user and user.is_authenticated and user.is_active):
        raise Unauthenticated("sign in to change your notifications")
    return user


def notification_settings(user: Any) -> Notifications:
    """How the person is told (email on or off, the webhook URL, the secret masked)."""
    return Notifications(**notify_services.settings_of(_person(user)))


def set_notification_settings(user: Any, values: dict[str, Any]) -> Notifications:
    """Change the fields `values` names; the settings as they are afterwards."""
    return Notifications(**notify_services.set_settings(_person(user), values))
