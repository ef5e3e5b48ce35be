from __future__ import annotations

from django.apps import AppConfig


class PoliciesAppConfig(AppConfig):
    name = "policies_app"
    label = "policies_app"
    verbose_name = "Policies"
