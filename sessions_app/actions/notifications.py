"""Notifications: the signed-in person's own settings (no session involved)."""

from __future__ import annotations

from typing import Any

from sessions_app.errors import Unauthenticated
from sessions_app.notify import services as notify_services


def _person(user: Any) -> Any:
    if not (user and user.is_authenticated and user.is_active):
        raise Unauthenticated("sign in to change your notifications")
    return user


def notification_settings(user: Any) -> dict[str, Any]:
    """How the person is told (email on or off, the webhook URL, the secret masked)."""
    return notify_services.settings_of(_person(user))


def set_notification_settings(user: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Change the fields `values` names; the settings as they are afterwards."""
    return notify_services.set_settings(_person(user), values)
