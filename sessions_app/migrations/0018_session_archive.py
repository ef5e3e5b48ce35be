from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0017_schedules_and_lanes")]

    operations = [
        migrations.AddField("session", "archived_at", models.DateTimeField(blank=True, null=True)),
    ]
