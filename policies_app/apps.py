from __future__ import annotations

from django.apps import AppConfig


class PoliciesAppConfig(AppConfig):
    name = "policies_app"
    label = "policies_app"
    verbose_name = "Policies"

    def ready(self) -> None:
        # Imported here, not at the top: Django imports apps.py while the app
        # registry is still loading. The listener module registers itself
        # with the log's fan-out on import; the veto plugs into the runtime.
        from policies_app import allowlist, listeners  # noqa: F401
        from sessions_app.runtime import hooks

        hooks.register_pre_execute(allowlist.veto)
