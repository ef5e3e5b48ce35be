"""No spend goes unrecorded: the tokens in the log equal the tokens the
model server reported spending (its own count of the usage chunks it wrote),
across kill -9 mid-stream, a lost lease, duplicate delivery, a torn stream
after its usage and a Stop; a request whose figure nobody knows is an
explicit unknown (unpriced), never $0 and never missing. Real worker
processes where a process dies; the running totals always equal the log's
own sum."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.dispatch import wake
from sessions_app.runtime.drive import drive
from sessions_app.services import usage
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for


def spent_in_log(session: Session) -> int:
    row = Session.objects.get(id=session.id)
    return row.prompt_tokens + row.completion_tokens


def assert_audit(session: Session, fake: Any, label: str) -> usage.Totals:
    consistent, running, summed = usage.check_session(session.id)
    assert consistent, (running, summed)
    print(
        f"spend audit [{label}]: tokens at the model server {fake.tokens_sent}, in the log "
        f"{spent_in_log(session)}; requests {len(fake.requests)}; unpriced entries {running.unpriced}"
    )
    assert spent_in_log(session) == fake.tokens_sent
    return running


def step_records(session: Session) -> list[dict[str, Any]]:
    return [d for d in events(session, "usage/recorded") if d["purpose"] == "step"]


@pytest.fixture
def worker_session(make_user: Any, settings: Any, tmp_path: Any) -> Session:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(
        name="spend", roles={"main": "test/model"}, builtin_tools=["debug.noop", "debug.sleep"], allow_floor=["*"]
    )
    return services.create_session(make_user(), profile)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_kill_9_mid_stream_leaves_an_explicit_unknown(
    start_worker: Any, fake_llm: Any, worker_session: Session
) -> None:
    fake_llm.script(Reply(text="this stream never finishes", hang=True), Reply(text="recovered", usage=(40, 7, None)))
    first = start_worker(name="a")
    services.inject(worker_session.id, "talk", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 1, what="the model request")
    time.sleep(0.3)
    first.kill()
    start_worker(name="b")
    wait_for(lambda: events(worker_session, "turn/end"), timeout=40, what="turn/end after recovery")
    totals = assert_audit(worker_session, fake_llm, "kill -9 mid-stream")
    (unknown,) = step_records(worker_session)
    assert unknown["usage"] is None and unknown["step"] == 1 and "stopped" in unknown["reason"]
    assert totals.unpriced >= 1 and fake_llm.tokens_sent == 47


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_duplicate_delivery_makes_one_request_per_step(
    start_worker: Any, fake_llm: Any, worker_session: Session
) -> None:
    fake_llm.script(
        Reply(tool_calls=[("debug.noop", {})], latency=0.5, usage=(30, 4, 0.001)),
        Reply(text="done", latency=0.5, usage=(50, 6, 0.002)),
    )
    start_worker(name="a", concurrency=8)
    start_worker(name="b", concurrency=8)
    services.inject(worker_session.id, "go", wake=True)
    for _ in range(6):
        wake(worker_session.id)  # duplicates racing the first, on both workers
    wait_for(lambda: events(worker_session, "turn/end"), timeout=30, what="turn/end")
    assert len(fake_llm.requests) == 2, "one model request per step"
    totals = assert_audit(worker_session, fake_llm, "duplicate delivery")
    assert (totals.unpriced, step_records(worker_session)) == (0, [])
    assert str(Session.objects.get(id=worker_session.id).cost.normalize()) == "0.003"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
def test_a_stream_torn_after_its_usage_is_recorded_once(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="half an answer", omit_done=True, usage=(25, 3, 0.0004)))
    services.run_turn(session.id, "talk")
    assert drive(session.id) == "ended"
    (end,) = events(session, "turn/end")
    assert end["status"] == "failed"
    (record,) = step_records(session)
    assert record["usage"] == {"prompt_tokens": 25, "completion_tokens": 3, "cost": 0.0004}
    # The step/end that closed the step says its request counted already.
    (step_end,) = events(session, "step/end")
    assert step_end == {"step": 1, "usage_recorded": True}
    totals = assert_audit(session, fake_llm, "torn after usage")
    assert totals.unpriced == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
def test_a_stop_before_the_usage_is_an_explicit_unknown(fake_llm: Any, session: Session) -> None:
    import threading

    release = threading.Event()
    fake_llm.script(Reply(text="a long answer that is stopped", hang=release))
    services.run_turn(session.id, "talk")
    driver = threading.Thread(target=drive, args=(session.id,))
    driver.start()
    wait_for(lambda: len(fake_llm.requests) == 1, what="the model request")
    time.sleep(0.3)
    services.cancel(session.id, by="owner")
    driver.join(timeout=10)
    release.set()
    assert events(session, "turn/end")[-1]["status"] == "cancelled"
    totals = assert_audit(session, fake_llm, "stopped mid-stream")
    assert fake_llm.tokens_sent == 0 and totals.unpriced == 1, "unknown, never $0 and never missing"
    assert Event.objects.filter(session=session, kind="step/end").count() == 1
