from __future__ import annotations

from django.apps import AppConfig


class ApprovalsAppConfig(AppConfig):
    name = "approvals_app"
    label = "approvals_app"
    verbose_name = "Approvals"
