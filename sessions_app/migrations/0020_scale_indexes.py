from django.db import migrations, models


class Migration(migrations.Migration):
    """Partial indexes for a service whose sessions are mostly idle
    (docs/scaling.md): the sweep and the approvals badge read open turns
    only, so their cost follows the open turns, not the sessions."""

    dependencies = [("sessions_app", "0018_session_archive")]

    operations = [
        migrations.AddIndex(
            model_name="session",
            index=models.Index(
                condition=models.Q(("open_turn_seq__isnull", False), ("pending_approvals", 0)),
                fields=["open_turn_seq"],
                name="session_open_turn",
            ),
        ),
        migrations.AddIndex(
            model_name="session",
            index=models.Index(
                condition=models.Q(("open_turn_seq__isnull", False), ("pending_approvals__gt", 0)),
                fields=["pending_approvals"],
                name="session_parked",
            ),
        ),
    ]
