from __future__ import annotations

from typing import Any

from django.db import migrations


def create_demo_profile(apps: Any, schema_editor: Any) -> None:
    AgentProfile = apps.get_model("sessions_app", "AgentProfile")
    AgentProfile.objects.get_or_create(
        name="demo",
        defaults={
            "description": "Built-in tools: clock and a sandboxed workspace. Writing a file asks for approval.",
            "roles": {},
            "builtin_tools": ["clock.now", "workspace.list", "workspace.read", "workspace.write"],
            "allow_floor": ["clock.*", "workspace.*"],
            "compaction_budget": 100_000,
        },
    )


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0003_input_receipts")]
    operations = [migrations.RunPython(create_demo_profile, migrations.RunPython.noop)]
