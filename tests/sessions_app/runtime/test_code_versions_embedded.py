"""Code versions in one process, on both databases (the embedded SQLite path
included): a drive by code whose catalogue reads an older version than the
log holds writes nothing of its own; it leaves the session (`left`) when a
live worker's row says it reads that version, and otherwise blocks the open
turn `unsupported_version` with nothing lost. The real worker processes are
in test_code_versions.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sessions_app import services
from sessions_app.log import catalogue
from sessions_app.models import Session, WorkerProcess
from sessions_app.runtime.drive import drive
from sessions_app.runtime.outcomes import Outcome
from tests.helpers import events, kinds

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

NEWER = {"input/queued": 2, "user/message": 2}


@pytest.fixture
def written_by_newer_code(session: Session, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The session's turn opened by newer code (NEWER's versions); this process then runs the older catalogue."""
    older = {kind: catalogue.CATALOGUE[kind] for kind in NEWER}
    for kind, version in NEWER.items():
        monkeypatch.setitem(catalogue.CATALOGUE, kind, replace(older[kind], version=version))
    services.inject(session.id, "hello", wake=True)  # manual worker: the turn opens, nobody drives it
    for kind, spec in older.items():
        monkeypatch.setitem(catalogue.CATALOGUE, kind, spec)
    return kinds(session)


def test_no_live_worker_reads_it_so_the_turn_blocks_whole(session: Session, written_by_newer_code: list[str]) -> None:
    assert drive(session.id) is Outcome.BLOCKED
    assert kinds(session) == [*written_by_newer_code, "turn/blocked"]
    (blocked,) = events(session, "turn/blocked")
    assert blocked["code"] == "unsupported_version"
    assert blocked["what"] in {f"event:{k}@{v}" for k, v in NEWER.items()}
    s = Session.objects.get(id=session.id)
    assert s.open_turn_seq is not None and s.blocked_seq is not None and s.lease_owner == ""
    assert drive(session.id) is Outcome.BLOCKED  # a stray wake-up writes nothing more
    assert kinds(session).count("turn/blocked") == 1


def test_a_live_worker_that_reads_it_gets_it(session: Session, written_by_newer_code: list[str]) -> None:
    WorkerProcess.objects.create(key=7, host="newer", pid=1, build="0.2.0", event_versions=NEWER)
    WorkerProcess.objects.create(key=8, host="older", pid=2, build="0.1.0", event_versions=catalogue.versions())
    assert drive(session.id) is Outcome.LEFT
    assert kinds(session) == written_by_newer_code  # nothing driven, nothing written
    assert Session.objects.get(id=session.id).lease_owner == ""
