"""A "reviewers" group holding the approve permission, so granting review
rights is adding a user to a group in the admin."""

from __future__ import annotations

from typing import Any

from django.db import migrations

GROUP = "reviewers"


def create_group(apps: Any, schema_editor: Any) -> None:
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    # post_migrate creates permissions only after every migration has run,
    # so make sure this one exists now (get_or_create: it is the same row).
    ct, _ = ContentType.objects.get_or_create(app_label="approvals_app", model="approvalpermissions")
    perm, _ = Permission.objects.get_or_create(
        content_type=ct, codename="decide_approval", defaults={"name": "Can approve or deny parked tool calls"}
    )
    group, _ = Group.objects.get_or_create(name=GROUP)
    group.permissions.add(perm)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals_app", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(create_group, migrations.RunPython.noop)]
