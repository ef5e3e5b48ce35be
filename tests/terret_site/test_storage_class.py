"""The storage class in force (docs/storage.md): every connection of each
setup runs with the durability settings the docs promise, so a changed
default (in the settings, the init command, the pool, the server) fails here
instead of passing silently.

Connections checked: the test process's own, one per thread (Django opens a
connection per thread), and those of a separate process configured like a
deployment (on PostgreSQL with the connection pool a worker has), several
held at once so they are distinct connections.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections

ROOT = Path(settings.BASE_DIR)

# A separate process: N threads each hold a connection at the same moment
# (a barrier), so the pool hands out N distinct connections.
CHILD = r"""
import json, sys, threading
import django
django.setup()
from django.db import connection, connections
N = int(sys.argv[1])
SQL = sys.argv[2:]
barrier = threading.Barrier(N)
out = []
def one():
    with connection.cursor() as cur:
        row = []
        for sql in SQL:
            cur.execute(sql)
            row.append(str(cur.fetchone()[0]).lower())
        barrier.wait(timeout=30)
        pg = connection.vendor == "postgresql"
        out.append({"pid": connection.connection.info.backend_pid if pg else None, "values": row})
    connections.close_all()
threads = [threading.Thread(target=one) for _ in range(N)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(out))
"""

SQLITE_SQL = ["PRAGMA synchronous", "PRAGMA journal_mode"]
# PRAGMA synchronous answers a number: 1 NORMAL, 2 FULL, 3 EXTRA.
SQLITE_FULL = ["2", "wal"]
PG_SQL = ["SHOW fsync", "SHOW synchronous_commit"]
PG_DURABLE = ["on", "on"]


def _values(sql: list[str]) -> list[str]:
    out = []
    with connection.cursor() as cur:
        for statement in sql:
            cur.execute(statement)
            out.append(str(cur.fetchone()[0]).lower())
    return out


def _in_threads(sql: list[str], n: int = 3) -> list[list[str]]:
    found: list[list[str]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            found.append(_values(sql))
        except BaseException as exc:  # reported below, not swallowed in the thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return found


def _child(env: dict[str, str], sql: list[str], n: int = 4) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), *sql],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(rows) == n
    return rows


def _sqlite_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TERRET_SQLITE_SYNCHRONOUS", None)
    env.update({"DATABASE_URL": f"sqlite:///{connection.settings_dict['NAME']}", "REDIS_URL": "", **extra})
    return env


@pytest.mark.django_db(transaction=True)
def test_embedded_sqlite_is_synchronous_full_on_every_connection() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the embedded path (DATABASE_URL=sqlite:///...)")
    assert settings.TERRET_SQLITE_SYNCHRONOUS == "FULL"
    assert _values(SQLITE_SQL) == SQLITE_FULL
    assert _in_threads(SQLITE_SQL) == [SQLITE_FULL] * 3
    rows = _child(_sqlite_env(), SQLITE_SQL)
    assert [r["values"] for r in rows] == [SQLITE_FULL] * 4


@pytest.mark.django_db(transaction=True)
def test_embedded_sqlite_trades_down_to_normal_only_when_asked() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the embedded path (DATABASE_URL=sqlite:///...)")
    rows = _child(_sqlite_env(TERRET_SQLITE_SYNCHRONOUS="normal"), SQLITE_SQL, n=2)
    assert [r["values"] for r in rows] == [["1", "wal"]] * 2


def test_a_synchronous_setting_that_is_not_a_level_is_refused(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "terret_site.settings",
        "TERRET_VAR_DIR": str(tmp_path / "var"),
        "SECRET_KEY": "k" * 50,
        "TERRET_SQLITE_SYNCHRONOUS": "OFF",
    }
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "TERRET_SQLITE_SYNCHRONOUS='OFF' must be FULL, EXTRA or NORMAL" in result.stderr


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_postgresql_fsync_and_synchronous_commit_on_every_connection() -> None:
    from tests.workers import worker_env

    assert _values(PG_SQL) == PG_DURABLE
    assert _in_threads(PG_SQL) == [PG_DURABLE] * 3
    # A worker's configuration: the connection pool (TERRET_DB_POOL_MAX), 4 connections held at once.
    rows = _child(worker_env(TERRET_DB_POOL_MAX="4", TERRET_DB_POOL_MIN="4"), PG_SQL)
    assert len({r["pid"] for r in rows}) == 4
    assert [r["values"] for r in rows] == [PG_DURABLE] * 4
