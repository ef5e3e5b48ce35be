"""SQLite, the embedded path: Django's cursor, inside the writer's
IMMEDIATE transaction (which serializes every writer of the file)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import connection

from sessions_app.log.records import WORKLOAD_COLUMNS
from sessions_app.log.runs import EVENT_TABLE, SESSION_TABLE, SLOTS_WANTED, Run, tally_shard
from sessions_app.log.sql import Sql

ONE_STATEMENT = False
claim_extras = False
# Session.event_versions takes the run's {kind: version} (above version 1),
# keeping each kind's highest: a writer of older code may append after a newer one.
VERSIONS_SET = (
    "event_versions = json_patch(COALESCE(event_versions, '{}'), (SELECT json_group_object(v.key, "
    f"max(v.value, COALESCE(json_extract({SESSION_TABLE}.event_versions, '$.\"' || v.key || '\"'), 0))) "
    "FROM json_each(%s) AS v))"
)


def param(value: Any) -> Any:
    """SQLite keeps UUIDs as hex text and needs Django's datetime adaptation."""
    if isinstance(value, uuid.UUID):
        return value.hex
    if isinstance(value, datetime):
        return connection.ops.adapt_datetimefield_value(value)
    return value


def fetch(sql: str, params: list[Any]) -> list[dict[str, Any]]:
    with connection.cursor() as cur:
        cur.execute(sql, [param(p) for p in params])
        if cur.description is None:
            return []
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


fetch_unprepared = fetch  # SQLite's own statement cache is all there is


def append_run(run: Run) -> list[dict[str, Any]]:
    """The UPDATE (row lock, seqs), then the INSERT of every event, then the
    kind's extra writes reading the updated row as `s`."""
    q = Sql(f"UPDATE {SESSION_TABLE} SET ").extend(run.set_sql(VERSIONS_SET))
    q.add(" WHERE ").extend(run.where_sql(run.session_id)).add(" RETURNING last_seq, profile_id")
    if run.release:
        q.add("".join(f", {c}" for c in WORKLOAD_COLUMNS)).add(f", {SLOTS_WANTED}")
    updated = fetch(q.text, q.params)
    if not updated:
        return []
    row = updated[0]
    first = int(row["last_seq"]) - len(run.items) + 1
    insert = Sql(f"INSERT INTO {EVENT_TABLE} (session_id, seq, kind, data, created_at, version) VALUES ")
    insert.join(
        ", ",
        (
            Sql("(%s, %s, %s, %s, %s, %s)", run.session_id, first + i, e.kind, e.payload, run.now, e.spec.version)
            for i, e in enumerate(run.items)
        ),
    )
    fetch(insert.text, insert.params)
    for sql, params in run.extras:
        fetch(
            f"WITH s(last_seq, profile_id, day, shard) AS (SELECT %s, %s, %s, %s) {sql}",
            [row["last_seq"], row["profile_id"], run.now.date().isoformat(), tally_shard(run.session_id), *params],
        )
    workload = {c: row[c] for c in (*WORKLOAD_COLUMNS, "slots_wanted")} if run.release else {}
    return [{"seq": first + i, **workload} for i in range(len(run.items))]
