from __future__ import annotations

from typing import Any

from django.db import migrations

# Postgres refuses UPDATE and DELETE on the log itself, so raw SQL (a psql
# session, a buggy migration) cannot rewrite history either. TRUNCATE is left
# to the operator; it is not a row-level change.
CREATE = """
CREATE OR REPLACE FUNCTION terret_event_immutable() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'sessions_app_event is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER terret_event_immutable
    BEFORE UPDATE OR DELETE ON sessions_app_event
    FOR EACH ROW EXECUTE FUNCTION terret_event_immutable();
"""
DROP = """
DROP TRIGGER IF EXISTS terret_event_immutable ON sessions_app_event;
DROP FUNCTION IF EXISTS terret_event_immutable();
"""


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
