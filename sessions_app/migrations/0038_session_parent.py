import django.db.models.deletion
from django.db import migrations, models


def backfill(apps, schema_editor):
    """Subagent sessions made before the column: their parent is the task's session."""
    Session = apps.get_model("sessions_app", "Session")
    Task = apps.get_model("sessions_app", "Task")
    for parent, child in Task.objects.filter(child_session__isnull=False).values_list("session_id", "child_session_id"):
        Session.objects.filter(id=child, parent_session__isnull=True).update(parent_session_id=parent)


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0037_tally_shards"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="parent_session",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="sessions_app.session",
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
