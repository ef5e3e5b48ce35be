from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0022_profile_image_roles")]

    operations = [
        migrations.AddIndex(
            model_name="session",
            index=models.Index(
                condition=models.Q(("last_input_seq__gt", models.F("inbox_seq"))),
                fields=["last_input_seq"],
                name="session_inbox_waiting",
            ),
        ),
    ]
