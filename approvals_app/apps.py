from __future__ import annotations

from django.apps import AppConfig


class ApprovalsAppConfig(AppConfig):
    name = "approvals_app"
    label = "approvals_app"
    verbose_name = "Approvals"

    def ready(self) -> None:
        # Imported here, not at the top: Django imports apps.py while the app
        # registry is still loading. The listener module registers itself
        # with the log's fan-out on import; the gate plugs into the runtime.
        from approvals_app import deadlines, gate, listeners  # noqa: F401
        from sessions_app.runtime import hooks

        hooks.register_gate(gate)  # the module's three functions are the runtime's Gate
        hooks.register_clock(deadlines.clock)  # on every worker's clock thread
