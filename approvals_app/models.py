from __future__ import annotations

from django.db import models


class ApprovalPermissions(models.Model):
    """Carries the approval permission; approvals themselves live in the log."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("decide_approval", "Can approve or deny parked tool calls")]

    def __str__(self) -> str:
        return "approval permissions"
