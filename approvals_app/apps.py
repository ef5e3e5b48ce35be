from __future__ import annotations

from django.apps import AppConfig


class ApprovalsAppConfig(AppConfig):
    name = "approvals_app"
    label = "approvals_app"
    verbose_name = "Approvals"

    def ready(self) -> None:
        # Listener modules register themselves with the log's fan-out on import.
        from approvals_app import listeners  # noqa: F401
