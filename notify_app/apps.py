from __future__ import annotations

from django.apps import AppConfig


class NotifyAppConfig(AppConfig):
    name = "notify_app"
    label = "notify_app"
    verbose_name = "Notifications"

    def ready(self) -> None:
        # Imported here, not at the top: Django imports apps.py while the app
        # registry is still loading. The listener registers itself with the
        # log's fan-out on import.
        from notify_app import listeners  # noqa: F401
