"""Crash recovery with real Celery worker processes on Postgres and Redis.

A worker is SIGKILLed mid-tool or mid-model-stream, so no cleanup code runs;
a fresh worker process then completes the turn from the log on its first wake
(the sweep it runs at start and periodically, once the dead worker's lease
has expired)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.effects import effects_audit
from tests.fakes.fake_llm import Reply
from tests.helpers import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def log_of(session: Session) -> list[tuple[int, str, dict[str, Any]]]:
    return list(Event.objects.filter(session=session).order_by("seq").values_list("seq", "kind", "data"))


def kinds_of(session: Session) -> list[str]:
    return [k for _, k, _ in log_of(session)]


def turn_ended(session: Session) -> bool:
    return Event.objects.filter(session=session, kind="turn/end").exists()


@pytest.fixture
def session(make_user: Any, settings: Any, tmp_path: Any) -> Session:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(
        name="crash", roles={"main": "test/model"}, builtin_tools=["debug.sleep", "debug.noop"], allow_floor=["*"]
    )
    return services.create_session(make_user(), profile)


def assert_recovered(session: Session) -> None:
    entries = log_of(session)
    assert [seq for seq, _, _ in entries] == list(range(1, len(entries) + 1)), "seqs must be gapless"
    kinds = [k for _, k, _ in entries]
    assert kinds.count("turn/start") == 1
    assert kinds.count("turn/end") == 1
    assert [d for _, k, d in entries if k == "turn/end"] == [{"status": "completed"}]


def test_kill_9_mid_tool_then_fresh_worker_completes(start_worker: Any, fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(tool_calls=[("debug.sleep", {"seconds": 4})]), Reply(text="finished"))
    first = start_worker(name="a")
    services.inject(session.id, "sleep a little", wake=True)
    wait_for(lambda: "assistant/message" in kinds_of(session), what="the tool call")
    time.sleep(0.5)  # the worker is now inside debug.sleep
    first.kill()
    assert "tool/result" not in kinds_of(session)

    start_worker(name="b")
    wait_for(lambda: turn_ended(session), timeout=40, what="turn/end after recovery")
    assert_recovered(session)
    results = [d for _, k, d in log_of(session) if k == "tool/result"]
    call_id = next(d for _, k, d in log_of(session) if k == "assistant/message")["tool_calls"][0]["id"]
    assert [r["call_id"] for r in results] == [call_id], "the owed call is re-executed exactly once"
    assert results[0]["content"].startswith("slept")
    # debug.sleep is `safe`: the resume ran attempt 2 under attempt 1's key
    attempts = [d for _, k, d in log_of(session) if k == "tool/attempt"]
    assert [(a["call_id"], a["attempt"]) for a in attempts] == [(call_id, 1), (call_id, 2)]
    assert attempts[0]["idempotency_key"] == attempts[1]["idempotency_key"]
    assert (attempts[1]["replaces"], attempts[1]["why"]) == (1, "safe")
    assert results[0]["attempt"] == 2
    audit = effects_audit(session.id)
    assert audit.ok, audit.problems
    # step 1 was closed by the resume; step 2 is the final answer
    assert [d["step"] for _, k, d in log_of(session) if k == "step/end"] == [1, 2]
    assert len(fake_llm.requests) == 2


def test_kill_9_mid_model_stream_then_fresh_worker_completes(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(Reply(text="this stream never finishes", hang=True), Reply(text="recovered"))
    first = start_worker(name="a")
    services.inject(session.id, "talk", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 1, what="the model request")
    time.sleep(0.3)
    first.kill()
    assert "assistant/message" not in kinds_of(session)

    start_worker(name="b")
    wait_for(lambda: turn_ended(session), timeout=40, what="turn/end after recovery")
    assert_recovered(session)
    # the unclosed step/start stays; numbering continues past it
    assert [d["step"] for _, k, d in log_of(session) if k == "step/start"] == [1, 2]
    assert [d["step"] for _, k, d in log_of(session) if k == "step/end"] == [2]
    assert [d["content"] for _, k, d in log_of(session) if k == "assistant/message"] == ["recovered"]


def test_worker_runs_turns_and_parks_without_holding_a_thread(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    """A long chat through a real worker; a concurrent duplicate wake-up is harmless."""
    fake_llm.script(Reply(tool_calls=[("debug.noop", {})]), Reply(text="done"))
    start_worker(name="a", concurrency=4)
    services.inject(session.id, "hello", wake=True)
    from sessions_app.runtime.dispatch import wake

    wake(session.id)  # a duplicate delivery racing the first
    wait_for(lambda: turn_ended(session), what="turn/end")
    assert_recovered(session)
    assert len(fake_llm.requests) == 2
    # the driver lets go of the lease right after its turn/end commits
    wait_for(lambda: Session.objects.filter(id=session.id, lease_owner="").exists(), what="lease release")
    session.refresh_from_db()
    assert session.status == "idle"
