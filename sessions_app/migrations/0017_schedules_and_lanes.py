import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0016_model_spend")]

    operations = [
        migrations.AddField("agentprofile", "max_schedules", models.PositiveIntegerField(default=20)),
        migrations.AddField("agentprofile", "min_schedule_seconds", models.PositiveIntegerField(default=60)),
        migrations.AddField("agentprofile", "schedule_pause_after", models.PositiveIntegerField(default=3)),
        migrations.AddField("session", "deferred_seq", models.BigIntegerField(default=0)),
        migrations.AddField("session", "deferred_cursor", models.BigIntegerField(default=0)),
        migrations.AddField("session", "queued_follow_ups", models.IntegerField(default=0)),
        migrations.AddIndex(
            "session",
            models.Index(
                condition=models.Q(("queued_follow_ups__gt", 0)), fields=["queued_follow_ups"], name="session_owed"
            ),
        ),
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("due_at", models.DateTimeField(blank=True, null=True)),
                ("reason", models.CharField(blank=True, max_length=200)),
                ("text", models.TextField()),
                ("every_seconds", models.PositiveIntegerField(blank=True, null=True)),
                ("cron", models.CharField(blank=True, max_length=120)),
                (
                    "misfire",
                    models.CharField(
                        choices=[("skip", "skip"), ("run_once", "run_once"), ("reschedule", "reschedule")],
                        default="run_once",
                        max_length=16,
                    ),
                ),
                ("max_runs", models.PositiveIntegerField(blank=True, null=True)),
                ("runs", models.PositiveIntegerField(default=0)),
                ("budget_tokens", models.BigIntegerField(blank=True, null=True)),
                ("spent_tokens", models.BigIntegerField(default=0)),
                ("idempotency_key", models.CharField(blank=True, max_length=200, null=True)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "pending"),
                            ("claimed", "claimed"),
                            ("completed", "completed"),
                            ("skipped", "skipped"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                            ("paused", "paused"),
                        ],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("status_reason", models.CharField(blank=True, max_length=300)),
                ("created_by", models.CharField(blank=True, max_length=200)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("last_outcome", models.JSONField(blank=True, null=True)),
                ("skipped", models.PositiveIntegerField(default=0)),
                ("last_input_seq", models.BigIntegerField(blank=True, null=True)),
                ("last_run_counted", models.BooleanField(default=True)),
                ("no_progress", models.PositiveIntegerField(default=0)),
                ("generation", models.BigIntegerField(default=0)),
                (
                    "session",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="schedules",
                        to="sessions_app.session",
                    ),
                ),
            ],
            options={
                "ordering": ["due_at", "created_at"],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("session", "idempotency_key"),
                        name="schedule_session_key_uniq",
                    )
                ],
                "indexes": [
                    models.Index(condition=models.Q(("status", "pending")), fields=["due_at"], name="schedule_due"),
                    models.Index(fields=["session", "status"], name="schedule_session_status"),
                ],
            },
        ),
    ]
