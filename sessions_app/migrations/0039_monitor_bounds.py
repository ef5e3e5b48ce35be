from django.db import migrations, models


class Migration(migrations.Migration):
    """A monitor's schedule bounds (max_runs, expires_at: the profile's when the request gave none), and
    `completed`, the status a reached bound ends it in (runtime/schedules.py's timing, as a schedule's)."""

    dependencies = [
        ("sessions_app", "0038_session_parent"),
    ]

    operations = [
        migrations.AddField(
            model_name="monitor",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="monitor",
            name="max_runs",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="monitor",
            name="status",
            field=models.CharField(
                choices=[("active", "active"), ("cancelled", "cancelled"), ("completed", "completed")],
                default="active",
                max_length=16,
            ),
        ),
    ]
