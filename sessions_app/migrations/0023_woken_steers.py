from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0022_profile_image_roles"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="woken_steers",
            field=models.IntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name="session",
            index=models.Index(
                condition=models.Q(("woken_steers__gt", 0)), fields=["woken_steers"], name="session_woken"
            ),
        ),
    ]
