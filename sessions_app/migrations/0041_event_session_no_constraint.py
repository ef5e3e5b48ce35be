from typing import Any

import django.db.models.deletion
from django.db import migrations, models
from django.db.migrations.operations.base import Operation


class OnPostgres(Operation):
    """`operation` on PostgreSQL; on SQLite its state only. SQLite would remake
    the event table to drop a foreign key (and build its indexes from the
    state, the partial one of 0040 included); its check writes no WAL."""

    def __init__(self, operation: Operation) -> None:
        self.operation = operation

    def state_forwards(self, app_label: str, state: Any) -> None:
        self.operation.state_forwards(app_label, state)

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            self.operation.database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            self.operation.database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        return f"{self.operation.describe()} (PostgreSQL only)"


# The delete side of the dropped constraint, kept: raw SQL cannot delete a
# session that has a log either. It costs nothing per append (a session row
# is never deleted in the running system).
KEEP_LOG = """
CREATE OR REPLACE FUNCTION terret_session_keeps_its_log() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sessions_app_event WHERE session_id = OLD.id) THEN
        RAISE EXCEPTION 'session % has events: its log is kept (DELETE refused)', OLD.id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN OLD;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER terret_session_keeps_its_log
    BEFORE DELETE ON sessions_app_session
    FOR EACH ROW EXECUTE FUNCTION terret_session_keeps_its_log();
"""
DROP_KEEP_LOG = """
DROP TRIGGER IF EXISTS terret_session_keeps_its_log ON sessions_app_session;
DROP FUNCTION IF EXISTS terret_session_keeps_its_log();
"""


def keep_log(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(KEEP_LOG, params=None)


def drop_keep_log(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_KEEP_LOG, params=None)


class Migration(migrations.Migration):
    """An event's session reference is not checked by PostgreSQL per event
    (models.Event says why); deleting a session that has events is still refused."""

    dependencies = [
        ("sessions_app", "0040_event_rare_kind_index"),
    ]

    operations = [
        OnPostgres(
            migrations.AlterField(
                model_name="event",
                name="session",
                field=models.ForeignKey(
                    db_constraint=False,
                    db_index=False,
                    on_delete=django.db.models.deletion.PROTECT,
                    related_name="events",
                    to="sessions_app.session",
                ),
            )
        ),
        migrations.RunPython(keep_log, drop_keep_log),
    ]
