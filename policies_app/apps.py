from __future__ import annotations

from django.apps import AppConfig


class PoliciesAppConfig(AppConfig):
    name = "policies_app"
    label = "policies_app"
    verbose_name = "Policies"

    def ready(self) -> None:
        from policies_app import allowlist, listeners  # noqa: F401
        from sessions_app.runtime.hooks import register_pre_execute

        register_pre_execute(allowlist.veto)
