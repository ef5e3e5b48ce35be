"""Code versions with real Celery worker processes on PostgreSQL and Redis:
a worker never drives a session whose log holds an event version newer
than its catalogue reads. It leaves the session to a live worker that reads
it; with none, the open turn is blocked `unsupported_version` and nothing is
lost, and a newer worker finishes it once.

"Newer code" is this test process and a worker started with
TERRET_TEST_EVENT_VERSIONS (honoured under TERRET_TESTING only): both write
and read input/queued and user/message at version 2. The "older" worker runs
the catalogue as it is (every kind at version 1)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from sessions_app import services
from sessions_app.log import catalogue
from sessions_app.models import AgentProfile, Session, WorkerProcess
from sessions_app.services import operators
from tests.fakes.fake_llm import Reply
from tests.helpers import events, kinds, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

NEWER = {"input/queued": 2, "user/message": 2}


@pytest.fixture
def session(make_user: Any, settings: Any, tmp_path: Any) -> Session:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(name="codever", roles={"main": "test/model"}, allow_floor=["*"])
    return services.create_session(make_user(), profile)


@pytest.fixture
def newer_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process (the web tier of the new release) writes NEWER's versions."""
    for kind, version in NEWER.items():
        monkeypatch.setitem(catalogue.CATALOGUE, kind, replace(catalogue.CATALOGUE[kind], version=version))


def start_newer(start_worker: Any, name: str = "new") -> Any:
    return start_worker(name=name, TERRET_TESTING="1", TERRET_TEST_EVENT_VERSIONS=json.dumps(NEWER))


def written_versions(session: Session) -> set[str]:
    s = Session.objects.get(id=session.id)
    return {f"event:{k}@{v}" for k, v in (s.event_versions or {}).items()}


def test_no_live_worker_reads_the_log_so_the_turn_blocks_and_a_newer_worker_finishes_it_unasked(
    start_worker: Any, fake_llm: Any, session: Session, newer_code: None
) -> None:
    fake_llm.script(Reply(text="done"))
    old = start_worker(name="old")
    (row,) = WorkerProcess.objects.all()
    assert row.event_versions["user/message"] == 1 and row.event_versions["input/queued"] == 1
    assert row.build.startswith("0.1.0")

    services.inject(session.id, "hello", wake=True)
    wait_for(lambda: "turn/blocked" in kinds(session), what="the turn blocked")
    (blocked,) = events(session, "turn/blocked")
    assert blocked["code"] == "unsupported_version"
    assert blocked["what"] in written_versions(session)
    assert fake_llm.requests == []  # the older worker drove nothing
    assert "turn/end" not in kinds(session)
    assert old.proc.poll() is None  # nothing crashed

    new = start_newer(start_worker)
    assert WorkerProcess.objects.filter(pid=new.pid, event_versions__contains=NEWER).exists()
    # No operator: the newer worker's sweep finds the turn it reads and asks for it again.
    wait_for(lambda: "turn/end" in kinds(session), what="the newer worker's turn/end")
    (asked,) = events(session, "turn/retry_requested")
    assert asked["by"].startswith("worker:0.1.0")
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert [m["content"] for m in events(session, "assistant/message")] == ["done"]
    seen = fake_llm.requests[0]["messages"]
    assert [m["content"] for m in seen if m["role"] == "user"] == ["hello"]  # the input, once, not lost
    assert kinds(session).count("turn/start") == 1


def test_a_worker_leaves_a_log_it_cannot_read_to_a_live_worker_that_can(
    start_worker: Any, fake_llm: Any, session: Session, newer_code: None
) -> None:
    fake_llm.script(Reply(text="done"))
    new = start_newer(start_worker)
    old = start_worker(name="old")
    os.kill(new.pid, signal.SIGSTOP)  # alive (its liveness lock held) but taking no task for now
    try:
        services.inject(session.id, "hello", wake=True)
        wait_for(lambda: "left to one that does" in old.output(), what="the older worker leaving it")
        time.sleep(1.0)  # it keeps passing the session on, never driving it
        assert fake_llm.requests == []
        assert "turn/blocked" not in kinds(session)
    finally:
        os.kill(new.pid, signal.SIGCONT)
    wait_for(lambda: "turn/end" in kinds(session), what="the newer worker's turn/end")
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert "turn/blocked" not in kinds(session)
    assert len(fake_llm.requests) == 1


def test_waiting_input_no_live_worker_reads_is_stranded_then_a_newer_worker_runs_it_once(
    start_worker: Any, fake_llm: Any, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: a follow-up the next release's web tier queued (input/deferred
    at version 2) waits behind a turn an old worker runs. The turn ends; no
    turn is open, and no live worker reads the log: the session is listed
    stranded (unsupported_version). A worker of the next release starts: its
    sweep drives the session with no other stimulus, the listing clears, and
    the follow-up is answered once."""
    gate = threading.Event()
    fake_llm.script(Reply(text="one", hang=gate), Reply(text="two"))
    old = start_worker(name="old")
    services.inject(session.id, "first", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 1, what="the old worker's model call")
    deferred = replace(catalogue.CATALOGUE["input/deferred"], version=2)
    monkeypatch.setitem(catalogue.CATALOGUE, "input/deferred", deferred)  # the next release's web tier
    assert services.inject(session.id, "later", lane="follow_up").disposition == "queued"
    gate.set()
    wait_for(lambda: "no live worker reads it" in old.output(), what="the old worker leaving the follow-up")
    time.sleep(1.0)  # its sweeps keep offering the session: nothing runs, nothing is appended
    assert kinds(session).count("turn/start") == 1 and len(fake_llm.requests) == 1
    row = Session.objects.get(id=session.id)
    assert row.open_turn_seq is None and row.queued_follow_ups == 1
    item = {i.session_id: i.detail for i in operators.attention()["stranded"]}[str(session.id)]
    assert (item["code"], item["what"], item["waiting"]) == ("unsupported_version", "event:input/deferred@2", "input")
    assert old.proc.poll() is None  # nothing crashed

    start_worker(name="new", TERRET_TESTING="1", TERRET_TEST_EVENT_VERSIONS=json.dumps({"input/deferred": 2}))
    assert str(session.id) not in {i.session_id for i in operators.attention()["stranded"]}
    wait_for(lambda: kinds(session).count("turn/end") == 2, what="the follow-up's turn, by the newer worker")
    time.sleep(1.5)  # a second run would show by now (sweeps every 0.5 s)
    assert [m["content"] for m in events(session, "assistant/message")] == ["one", "two"]
    assert len(fake_llm.requests) == 2
    users = [m["content"] for m in fake_llm.requests[1]["messages"] if m["role"] == "user"]
    assert users == ["first", "later"]  # the follow-up, once, not lost
    assert [e["status"] for e in events(session, "turn/end")] == ["completed", "completed"]
