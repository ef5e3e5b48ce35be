from typing import Any

from django.db import migrations, models

# Frozen here as they were when this migration was written (models.STEP_EVENT_KINDS).
STEP_EVENT_KINDS = ("assistant/message", "step/end", "step/start", "tool/attempt", "tool/result")
FIELDS = ["session", "kind", "seq"]
OLD, NEW = "event_session_kind_seq", "event_rare_kind_seq"


def _rare() -> models.Index:
    return models.Index(fields=FIELDS, name=NEW, condition=~models.Q(kind__in=STEP_EVENT_KINDS))


def _invalid(schema_editor: Any, name: str) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
            [name],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def _swap(apps: Any, schema_editor: Any, build: models.Index, gone: str) -> None:
    event = apps.get_model("sessions_app", "Event")
    if schema_editor.connection.vendor == "postgresql":
        # Concurrently, outside a transaction: a live log keeps taking appends
        # while the new index builds, and the old one serves until it is dropped.
        # A build that failed half-way (a run cut off) leaves an invalid index
        # that IF NOT EXISTS would keep: built afresh instead.
        if _invalid(schema_editor, build.name):
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(build.name)}")
        sql = str(build.create_sql(event, schema_editor))
        schema_editor.execute(sql.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1))
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(gone)}")
        return
    # SQLite: the index stays whole under the new name (models.Event.Meta says why).
    schema_editor.remove_index(event, models.Index(fields=FIELDS, name=gone))
    schema_editor.add_index(event, models.Index(fields=FIELDS, name=build.name))


def forward(apps: Any, schema_editor: Any) -> None:
    _swap(apps, schema_editor, _rare(), OLD)


def backward(apps: Any, schema_editor: Any) -> None:
    _swap(apps, schema_editor, models.Index(fields=FIELDS, name=OLD), NEW)


class Migration(migrations.Migration):
    """The event index by kind leaves out the kinds every model step writes
    (two index entries per such append, not three); whole on SQLite."""

    atomic = False

    dependencies = [
        ("sessions_app", "0039_monitor_bounds"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="event", name=OLD),
                migrations.AddIndex(model_name="event", index=_rare()),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
