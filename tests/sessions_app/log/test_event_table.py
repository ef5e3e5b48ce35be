"""The event table's writes per append (models.Event, bench/peers.py's WAL
per step).

- Its index by kind (migration 0040): on PostgreSQL it leaves out the kinds
  every model step writes, so such an append writes two index entries, not
  three; a lookup of a rarer kind still walks it, and a lookup of a step's
  kind finds it within a few rows of the (session, seq) index. On SQLite it
  is whole.
- Its session reference (migration 0041): no foreign-key check in
  PostgreSQL (no row lock on the session, so no WAL record, per append);
  what the check guarded still holds: an append to a missing session writes
  nothing, and a session with events cannot be deleted."""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from sessions_app import log
from sessions_app.errors import SessionNotFound
from sessions_app.log import reads
from sessions_app.models import STEP_EVENT_KINDS, Event, Session

pytestmark = pytest.mark.django_db

HISTORY = 3000
TABLE = Event._meta.db_table


def _history(session: Session) -> None:
    """A policy set once at seq 1, then HISTORY events of model steps, in one
    statement (test data: what is under test is the read)."""
    now = datetime.now(UTC)
    pg = connection.vendor == "postgresql"
    sid: Any = session.id if pg else session.id.hex
    at: Any = now if pg else now.isoformat()
    steps = ["step/start", "assistant/message", "tool/attempt", "tool/result", "step/end"]
    rows = [(sid, 1, "policy/updated", json.dumps({"policy": {}}), at)]
    rows += [(sid, seq, steps[seq % 5], "{}", at) for seq in range(2, HISTORY + 2)]
    with connection.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {TABLE} (session_id, seq, kind, data, created_at) VALUES (%s, %s, %s, %s, %s)", rows
        )
        cur.execute("UPDATE sessions_app_session SET last_seq = %s WHERE id = %s", [HISTORY + 1, sid])
        if pg:
            cur.execute(f"ANALYZE {TABLE}")


def _plan(sql: str) -> dict[str, Any]:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        plan = cur.fetchone()[0]
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _touched(node: dict[str, Any]) -> int:
    own = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
    return max([own, *(_touched(child) for child in node.get("Plans", []))])


def _latest_sql(session: Session, kind: str) -> str:
    """The SQL that reads.latest_of_kind sent (its literals bound, as the planner saw them)."""
    with CaptureQueriesContext(connection) as ctx:
        reads.latest_of_kind(session.id, kind)
    (query,) = ctx.captured_queries
    return query["sql"]


def test_the_migration_and_the_model_leave_out_the_same_kinds() -> None:
    frozen = importlib.import_module("sessions_app.migrations.0040_event_rare_kind_index")
    assert frozen.STEP_EVENT_KINDS == STEP_EVENT_KINDS
    (index,) = Event._meta.indexes
    assert index.name == "event_rare_kind_seq"
    assert "step/start" in STEP_EVENT_KINDS and "session/compacted" not in STEP_EVENT_KINDS


@pytest.mark.postgres
def test_postgres_indexes_no_step_kind_and_every_other(make_session: Any) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'event_rare_kind_seq'")
        (definition,) = cur.fetchone()
        cur.execute("SELECT count(*) FROM pg_indexes WHERE tablename = %s", [TABLE])
        (indexes,) = cur.fetchone()
    assert "(session_id, kind, seq) WHERE (NOT" in definition, definition
    assert all(f"'{kind}'" in definition for kind in STEP_EVENT_KINDS), definition
    assert indexes == 3  # the primary key, (session, seq) and this one

    s = make_session()
    _history(s)
    assert reads.latest_of_kind(s.id, "policy/updated").seq == 1  # type: ignore[union-attr]
    rare = _plan(_latest_sql(s, "policy/updated"))
    assert "event_rare_kind_seq" in json.dumps(rare) and _touched(rare) < 5, json.dumps(rare, indent=1)
    step = _plan(_latest_sql(s, "step/end"))
    assert "event_session_seq_uniq" in json.dumps(step) and _touched(step) < 10, json.dumps(step, indent=1)
    assert "Seq Scan" not in json.dumps([rare, step])


@pytest.mark.embedded
def test_sqlite_keeps_the_index_whole(make_session: Any) -> None:
    """SQLite's planner cannot match a partial index to a query's bound
    parameters: its index holds every kind, and a lookup by kind walks it."""
    with connection.cursor() as cur:
        cur.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'event_rare_kind_seq'")
        (definition,) = cur.fetchone()
    assert "WHERE" not in definition.upper(), definition
    s = make_session()
    _history(s)
    assert reads.latest_of_kind(s.id, "policy/updated").seq == 1  # type: ignore[union-attr]
    qs = Event.objects.filter(session_id=s.id, kind="policy/updated").order_by("-seq").values_list("seq")[:1]
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = " ".join(str(row[-1]) for row in cur.fetchall())
    assert "event_rare_kind_seq" in plan, plan


@pytest.mark.postgres
def test_postgres_checks_no_foreign_key_per_event() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT contype FROM pg_constraint WHERE conrelid = %s::regclass", [TABLE])
        kinds = sorted(row[0] for row in cur.fetchall())
    assert kinds == ["c", "p", "u"], kinds  # version >= 0, the primary key, (session, seq): no "f"


def test_an_append_to_a_missing_session_writes_nothing() -> None:
    """Both backends: the writer inserts events only from the session row it
    updates. (The ORM refuses to delete a session that has events:
    test_immutability.py.)"""
    missing = "00000000-0000-4000-8000-000000000000"
    with pytest.raises(SessionNotFound):
        log.append(missing, "user/message", {"text": "nobody's"})
    assert not Event.objects.filter(session_id=missing).exists()


@pytest.mark.postgres
def test_postgres_refuses_to_delete_a_session_that_has_events(make_session: Any) -> None:
    """The dropped constraint's delete side, kept by a trigger: raw SQL
    cannot orphan a log. A session without events can go."""
    kept, empty = make_session(), make_session()
    log.append(kept.id, "user/message", {"text": "hello"})
    with pytest.raises(IntegrityError, match="its log is kept"), transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("DELETE FROM sessions_app_session WHERE id = %s", [kept.id])
    with connection.cursor() as cur:
        cur.execute("DELETE FROM sessions_app_session WHERE id = %s", [empty.id])
    assert Session.objects.filter(id=kept.id).exists() and not Session.objects.filter(id=empty.id).exists()
    assert Event.objects.filter(session_id=kept.id).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_migration_rebuilds_an_index_that_a_cut_off_run_left_invalid() -> None:
    """CREATE INDEX CONCURRENTLY cut off half-way leaves an invalid index of
    the new name: a second run builds it afresh (IF NOT EXISTS alone would
    keep it, and drop the old one)."""
    from django.db.migrations.executor import MigrationExecutor

    before, latest = ("sessions_app", "0039_monitor_bounds"), ("sessions_app", "0041_event_session_no_constraint")
    MigrationExecutor(connection).migrate([before])
    try:
        with connection.cursor() as cur:
            cur.execute(f"CREATE INDEX event_rare_kind_seq ON {TABLE} (session_id, kind, seq) WHERE kind = 'x'")
            cur.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'event_rare_kind_seq'::regclass")
    finally:
        MigrationExecutor(connection).migrate([latest])
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
            [TABLE],
        )
        found = {name: (valid, definition) for name, valid, definition in cur.fetchall()}
    assert set(found) == {"sessions_app_event_pkey", "event_session_seq_uniq", "event_rare_kind_seq"}
    valid, definition = found["event_rare_kind_seq"]
    assert valid and "'step/start'" in definition and "'x'" not in definition, definition
