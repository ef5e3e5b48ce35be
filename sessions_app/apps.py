from __future__ import annotations

from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    label = "sessions_app"
    verbose_name = "Sessions and agents"

    def ready(self) -> None:
        # Listener modules register themselves with the fan-out on import.
        from sessions_app import listeners  # noqa: F401
