from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0020_scale_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentprofile",
            name="image_roles",
            field=models.JSONField(
                blank=True, default=list, help_text='Model roles whose model accepts images, e.g. ["main"]'
            ),
        ),
    ]
