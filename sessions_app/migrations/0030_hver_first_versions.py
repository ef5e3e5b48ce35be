"""Version 1 of every profile that exists (runtime/versions.py records the
rest on save). The snapshot is of the profile as this migration sees it: a
field added by a later migration is in the next version, recorded at the
profile's next save or turn that finds its digest changed."""

from typing import Any

from django.db import migrations


def first_versions(apps: Any, schema_editor: Any) -> None:
    # Imported here: the snapshot is the runtime's own, the one definition of
    # what a turn depends on, and a migration module is loaded before apps are ready.
    from sessions_app.runtime.versions import digest_of, snapshot_of

    profiles = apps.get_model("sessions_app", "AgentProfile")
    versions = apps.get_model("sessions_app", "AgentVersion")
    for profile in profiles.objects.all():
        if versions.objects.filter(profile=profile).exists():
            continue
        snapshot = snapshot_of(profile)
        versions.objects.create(profile=profile, number=1, digest=digest_of(snapshot), snapshot=snapshot)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0029_hver_agent_versions")]

    operations = [migrations.RunPython(first_versions, migrations.RunPython.noop)]
