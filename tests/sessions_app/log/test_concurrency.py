"""Many OS processes appending to one session: gapless seqs, no duplicates.

Threads would share one interpreter and one dispatcher; the guarantee that
matters in the distributed setup is across processes (daphne + N Celery
workers), so these tests spawn real ones. Each child runs Django against the
same database, waits at a file barrier so all of them start together, then
appends as fast as it can, mixing single appends with two-event locked()
blocks, and reports the seqs it was given and the seqs its own listener saw.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from sessions_app.models import Event, Session

WRITERS = 8
ROUNDS = 40  # per writer; every 4th round is a locked() block of two events
PER_WRITER = ROUNDS + ROUNDS // 4

CHILD = r"""
import json, os, sys, time, uuid
import django
django.setup()
from sessions_app.log import append, locked, on_event

sid, writer, rounds, go = uuid.UUID(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
delivered = []
on_event()(lambda e: delivered.append(e.seq) if e.session_id == sid else None)
from django.db import connection
connection.ensure_connection()  # connect before the barrier so the race is on the row lock
print("ready", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("barrier never opened")
    time.sleep(0.002)
mine = []
for i in range(rounds):
    if i % 4 == 3:
        with locked(sid) as tx:
            a = tx.append("input/queued", {"text": f"{writer}:{i}:a", "wake": False})
            b = tx.append("input/queued", {"text": f"{writer}:{i}:b", "wake": False})
        mine += [a.seq, b.seq]
    else:
        mine.append(append(sid, "input/queued", {"text": f"{writer}:{i}", "wake": False}).seq)
connection.close()
print(json.dumps({"appended": mine, "delivered": delivered}), flush=True)
"""

ROOT = Path(settings.BASE_DIR)


def _child_env(database_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="terret_site.settings",
        DATABASE_URL=database_url,
        # Explicit values so a developer's .env cannot redirect the children.
        REDIS_URL=settings.REDIS_URL or "",
        TERRET_WORKER="inprocess",
        TERRET_DB_POOL_MAX="2",
        PYTHONPATH=str(ROOT),
    )
    return env


def _run_writers(database_url: str, session_id: uuid.UUID, tmp_path: Path) -> list[dict[str, list[int]]]:
    argvs = [[str(session_id), str(w), str(ROUNDS)] for w in range(WRITERS)]
    return run_at_barrier(CHILD, argvs, _child_env(database_url), tmp_path)


def run_at_barrier(code: str, argvs: list[list[str]], env: dict[str, str], tmp_path: Path) -> list[Any]:
    """One child process per argv running `code` (`python -c code *argv
    <barrier file>`). Each prints "ready" once connected and waits for the
    barrier file; the last line it prints is its JSON report."""
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *argv, str(go)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", f"child did not start: {line!r} {p.stderr.read() if p.stderr else ''}"
        go.touch()  # all children are connected: open the barrier
        reports = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _check(rows: list[tuple[int, str]], reports: list[dict[str, list[int]]], last_seq: int, min_switches: int) -> None:
    total = WRITERS * PER_WRITER
    seqs = [seq for seq, _ in rows]
    # Gapless from 1 and no duplicates, both in the table and in what the
    # children were handed.
    assert seqs == list(range(1, total + 1))
    assert last_seq == total
    handed = sorted(s for r in reports for s in r["appended"])
    assert handed == list(range(1, total + 1))

    texts = [text for _, text in rows]
    assert not [t for t, n in Counter(texts).items() if n > 1]
    by_text = {text: seq for seq, text in rows}
    for w in range(WRITERS):
        # Each writer's own events are in its program order...
        mine = [t for t in texts if t.split(":")[0] == str(w)]
        assert len(mine) == PER_WRITER
        assert [int(t.split(":")[1]) for t in mine] == sorted(int(t.split(":")[1]) for t in mine)
        # ...and a locked() block's two events are adjacent: nothing from
        # another process lands between them.
        for i in range(3, ROUNDS, 4):
            assert by_text[f"{w}:{i}:b"] == by_text[f"{w}:{i}:a"] + 1

    # Each process's listener saw exactly its own commits, in seq order.
    for r in reports:
        assert r["delivered"] == r["appended"] == sorted(r["appended"])

    # The writers really raced: seq order switches writer more often than the
    # WRITERS - 1 switches of a one-after-another run.
    owners = [t.split(":")[0] for t in texts]
    switches = sum(1 for a, b in zip(owners, owners[1:], strict=False) if a != b)
    assert switches >= min_switches, f"only {switches} writer switches: the processes did not overlap"


def _test_database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] or ""
    if s["PASSWORD"]:
        auth += f":{s['PASSWORD']}"
    host = s["HOST"] or "127.0.0.1"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgres://{auth}@{host}{port}/{s['NAME']}"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_eight_processes_append_to_one_session_postgres(make_session: Any, tmp_path: Path) -> None:
    session = make_session()
    # The children must write to pytest-django's test database, not the real one.
    assert connection.settings_dict["NAME"].startswith("test_")
    reports = _run_writers(_test_database_url(), session.id, tmp_path)
    rows = [
        (seq, data["text"])
        for seq, data in Event.objects.filter(session=session).order_by("seq").values_list("seq", "data")
    ]
    session.refresh_from_db()
    # Row-lock waiters queue fairly: runs of one writer are short.
    _check(rows, reports, session.last_seq, min_switches=4 * WRITERS)


SETUP = r"""
import django
django.setup()
from django.contrib.auth import get_user_model
from sessions_app.models import Session
user = get_user_model().objects.create_user("race")
print(Session.objects.create(owner=user).id)
"""


@pytest.mark.embedded
def test_eight_processes_append_to_one_session_sqlite_file(tmp_path: Path) -> None:
    """The embedded path: a SQLite file in WAL mode with IMMEDIATE
    transactions, written by several processes (daphne plus management
    commands, or a developer's shell)."""
    db = tmp_path / "race.sqlite3"
    url = f"sqlite:///{db}"
    env = _child_env(url)
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert migrate.returncode == 0, migrate.stderr
    made = subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    session_id = uuid.UUID(made.stdout.strip().splitlines()[-1])

    started = time.monotonic()
    reports = _run_writers(url, session_id, tmp_path)
    assert time.monotonic() - started < 120

    with sqlite3.connect(db) as con:
        rows = [
            (seq, json.loads(data)["text"])
            for seq, data in con.execute(
                "SELECT seq, data FROM sessions_app_event WHERE session_id = ? ORDER BY seq", [session_id.hex]
            )
        ]
        (last_seq,) = con.execute("SELECT last_seq FROM sessions_app_session WHERE id = ?", [session_id.hex]).fetchone()
    # SQLite's busy handler backs off with sleeps, so one writer often keeps
    # the lock for a burst; overlap shows as a few switches, not hundreds.
    _check(rows, reports, last_seq, min_switches=WRITERS)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_unique_constraint_backs_the_seq(make_session: Any) -> None:
    """Even a writer that bypasses append() cannot create a duplicate seq."""
    from django.db import IntegrityError

    session = make_session()
    from sessions_app.log import append

    append(session.id, "turn/start", {})
    with pytest.raises(IntegrityError), connection.cursor() as cur:
        cur.execute(
            "INSERT INTO sessions_app_event (session_id, seq, kind, data, created_at) "
            "VALUES (%s, 1, 'turn/start', '{}'::jsonb, now())",
            [session.id],
        )
    assert Session.objects.get(id=session.id).last_seq == 1
