"""log/backends/postgres.fetch: the runtime's fixed statements, bound server-side, prepared
on their first use on a connection unless preparing is off (a
transaction-mode pooler: TERRET_DB_PREPARE_THRESHOLD=0), and counted like
Django's own queries. Real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.log.backends.postgres import fetch

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

STATEMENT = "SELECT %s::int + 1 AS terret_prepared_probe"


def prepared() -> list[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s", ["%terret_prepared_probe%"])
        return [row[0] for row in cur.fetchall()]


@pytest.fixture
def threshold() -> Iterator[None]:
    connection.ensure_connection()
    before = connection.connection.prepare_threshold
    yield
    connection.connection.prepare_threshold = before


def test_a_statement_is_prepared_on_its_first_use(threshold: None) -> None:
    connection.connection.prepare_threshold = 5
    assert prepared() == []
    assert fetch(STATEMENT, [41]) == [{"terret_prepared_probe": 42}]
    assert len(prepared()) == 1


def test_nothing_is_prepared_when_preparing_is_off(threshold: None) -> None:
    connection.connection.prepare_threshold = None  # what TERRET_DB_PREPARE_THRESHOLD=0 configures
    for n in range(3):
        assert fetch(STATEMENT, [n]) == [{"terret_prepared_probe": n + 1}]
    assert prepared() == []


def test_its_statements_are_counted_like_djangos_own() -> None:
    with CaptureQueriesContext(connection) as queries:
        fetch(STATEMENT, [1])
    assert [q["sql"] for q in queries.captured_queries] == [STATEMENT]
