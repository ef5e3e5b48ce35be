"""PostgreSQL: statements bound server-side and prepared, one round trip per append.

Django's cursors bind client-side, which costs a Python-side mogrify per
call and can never use a prepared statement. The runtime's few fixed,
hot statements (appends, the lease claim, release and renewal, the turn's
view, the policy row) run here on Django's own psycopg connection instead,
prepared on their first use on each connection: planning an
UPDATE-then-INSERT CTE costs more than running it, and a worker's pool
spreads the statements over many connections, so psycopg's usual five uses
per connection would leave most of them unprepared. With
TERRET_DB_PREPARE_THRESHOLD=0 (a transaction-mode pooler) nothing is
prepared.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from django.db import connection
from psycopg.rows import dict_row

from sessions_app.log.catalogue import Tally
from sessions_app.log.records import WORKLOAD_COLUMNS
from sessions_app.log.runs import EVENT_TABLE, SESSION_TABLE, SLOTS_WANTED, Run, tally_shard
from sessions_app.log.sql import Sql

TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
# Session.event_versions takes the run's {kind: version} (above version 1),
# keeping each kind's highest: a writer of older code may append after a newer one.
VERSIONS_SET = (
    "event_versions = COALESCE(event_versions, '{}'::jsonb) || (SELECT jsonb_object_agg(v.key, "
    f"GREATEST(v.value::int, COALESCE(({SESSION_TABLE}.event_versions ->> v.key)::int, 0))) "
    "FROM jsonb_each_text(%s::jsonb) AS v)"
)
ONE_STATEMENT = True
claim_extras = True


def param(value: Any) -> Any:
    return value  # psycopg adapts UUIDs and datetimes itself


def fetch(sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """One of the fixed statements, prepared on its first use on this connection."""
    return _run(sql, params, prepare=True)


def fetch_unprepared(sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """A statement whose text varies (a list of leases): not worth preparing."""
    return _run(sql, params, prepare=False)


def _run(sql: str, params: list[Any], *, prepare: bool) -> list[dict[str, Any]]:
    connection.ensure_connection()
    started = time.monotonic()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection, row_factory=dict_row) as cur:  # type: ignore[arg-type]
        cur.execute(sql, params, prepare=prepare)  # type: ignore[arg-type]
        # Not `cur.description is not None`: that builds every Column, and
        # fetchall() (dict_row) builds them again. TUPLES_OK: the statement
        # returned rows (possibly none); anything else returns [].
        result = cur.pgresult
        rows = cur.fetchall() if result is not None and result.status == TUPLES_OK else []
    if connection.queries_logged:
        # Counted like Django's own queries (DEBUG, CaptureQueriesContext).
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return rows


def append_run(run: Run) -> list[dict[str, Any]]:
    """One statement: the UPDATE takes the row lock and yields the seqs, the
    kind's extra writes ride along as data-modifying CTEs reading the updated
    row `s` (s.profile_id, s.day, s.shard), and the INSERT writes every event."""
    n = len(run.items)
    q = Sql(f"WITH s AS (UPDATE {SESSION_TABLE} SET ").extend(run.set_sql(VERSIONS_SET))
    q.add(" WHERE ").extend(run.where_sql(run.session_id)).add(" RETURNING id, last_seq")
    if run.extras:
        q.add(
            ", profile_id, CAST(%s AS date) AS day, CAST(%s AS smallint) AS shard",
            run.now.date(),
            tally_shard(run.session_id),
        )
    if run.release:
        q.add("".join(f", {c}" for c in WORKLOAD_COLUMNS))
    q.add(")")
    for i, (sql, params) in enumerate(run.extras):
        if isinstance(sql, Tally):  # its row's update, the upsert only for a new row
            q.add(f", u{i} AS ({sql.update})", *params)
            q.add(f", x{i} AS ({sql.insert_unless(f'u{i}')})", *params)
        else:
            q.add(f", x{i} AS ({sql})", *params)
    if not run.versions:  # every event at version 1: the column's default, one statement text
        q.add(
            f", ins AS (INSERT INTO {EVENT_TABLE} (session_id, seq, kind, data, created_at) "
            f"SELECT s.id, s.last_seq - {n} + v.i, v.kind, v.data::jsonb, %s FROM s, (VALUES ",
            run.now,
        )
        q.join(", ", (Sql("(%s::int, %s::text, %s::text)", i, e.kind, e.payload) for i, e in enumerate(run.items, 1)))
        q.add(") AS v(i, kind, data) RETURNING seq) SELECT ins.seq")
    else:
        q.add(
            f", ins AS (INSERT INTO {EVENT_TABLE} (session_id, seq, kind, data, created_at, version) "
            f"SELECT s.id, s.last_seq - {n} + v.i, v.kind, v.data::jsonb, %s, v.version FROM s, (VALUES ",
            run.now,
        )
        q.join(
            ", ",
            (
                Sql("(%s::int, %s::text, %s::text, %s::smallint)", i, e.kind, e.payload, e.spec.version)
                for i, e in enumerate(run.items, 1)
            ),
        )
        q.add(") AS v(i, kind, data, version) RETURNING seq) SELECT ins.seq")
    if run.release:
        q.add("".join(f", s.{c}" for c in WORKLOAD_COLUMNS)).add(f", {SLOTS_WANTED}")
    q.add(" FROM ins, s ORDER BY ins.seq")
    return fetch(q.text, q.params)
