from __future__ import annotations

from typing import Any

from django.db import migrations, models


def backfill(apps: Any, schema_editor: Any) -> None:
    """Sessions that already repointed a role: their latest spec per role."""
    Event = apps.get_model("sessions_app", "Event")
    Session = apps.get_model("sessions_app", "Session")
    latest: dict[Any, dict[str, str]] = {}
    rows = Event.objects.filter(kind="model/updated").order_by("session_id", "seq").values_list("session_id", "data")
    for session_id, data in rows.iterator():
        latest.setdefault(session_id, {})[f"model_{data['role']}"] = data["spec"]
    for session_id, columns in latest.items():
        Session.objects.filter(id=session_id).update(**columns)


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0006_session_last_input_seq"),
    ]

    operations = [
        migrations.AddField(
            model_name="session", name="model_compactor", field=models.TextField(blank=True, default="")
        ),
        migrations.AddField(model_name="session", name="model_main", field=models.TextField(blank=True, default="")),
        migrations.AddField(model_name="session", name="model_titler", field=models.TextField(blank=True, default="")),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
