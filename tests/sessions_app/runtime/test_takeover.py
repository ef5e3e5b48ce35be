"""Taking a turn over from a worker that died, froze or is being deployed away,
with real Celery worker processes on PostgreSQL and Redis.

The lease settings are the production defaults (a 30 s TTL, a 15 s sweep)
unless a test says otherwise: a kill -9 is noticed through the dead process's
liveness lock (runtime/liveness.py), not through its lease's expiry. The
model server counts requests, so a step run twice would show."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.models import WorkerProcess as ProcessRow
from sessions_app.runtime.effects import effects_audit
from tests.fakes.fake_llm import Reply
from tests.helpers import wait_for
from tests.workers import DEFAULT_LEASES, WorkerProcess

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

TAKEOVER_SECONDS = 2.0
HANDOVER_SECONDS = 1.0


@pytest.fixture
def session(make_user: Any, settings: Any, tmp_path: Any) -> Session:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(
        name="takeover", roles={"main": "test/model"}, builtin_tools=["debug.noop"], allow_floor=["*"]
    )
    return services.create_session(make_user(), profile)


def log_of(session: Session) -> list[tuple[int, str, dict[str, Any]]]:
    return list(Event.objects.filter(session=session).order_by("seq").values_list("seq", "kind", "data"))


def _titling(event: tuple[int, str, dict[str, Any]]) -> bool:
    _, kind, data = event
    return kind == "session/titled" or (kind == "usage/recorded" and data.get("purpose") == "title")


def at(session: Session, kind: str, **data: Any) -> float:
    """When the session's event of this kind (and payload) committed, epoch seconds."""
    event = Event.objects.filter(session=session, kind=kind, **{f"data__{k}": v for k, v in data.items()}).get()
    return float(event.created_at.timestamp())


def turn_ended(session: Session) -> bool:
    return Event.objects.filter(session=session, kind="turn/end").exists()


def driving(session: Session, workers: list[WorkerProcess]) -> WorkerProcess:
    """The worker whose process holds the session's lease (owner: host:pid:thread:nonce)."""

    def holder() -> WorkerProcess | None:
        row = Session.objects.filter(id=session.id).values("lease_owner", "lease_process").get()
        if not row["lease_owner"]:
            return None
        assert row["lease_process"] is not None, "the claim records the claimer's liveness key"
        pid = int(row["lease_owner"].split(":")[1])
        return next(w for w in workers if w.pid == pid)

    found: WorkerProcess = wait_for(holder, what="a worker holding the lease")
    return found


def assert_completed_once(session: Session, *, answer: str) -> None:
    entries = log_of(session)
    assert [seq for seq, _, _ in entries] == list(range(1, len(entries) + 1)), "seqs must be gapless"
    kinds = [k for _, k, _ in entries]
    assert kinds.count("turn/start") == 1
    assert [d for _, k, d in entries if k == "turn/end"] == [{"status": "completed"}]
    assert [d["content"] for _, k, d in entries if k == "assistant/message"][-1] == answer
    audit = effects_audit(session.id)
    assert audit.ok, audit.problems


def test_kill_9_of_the_driving_worker_the_other_finishes_within_2s(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(Reply(text="this stream never finishes", hang=True), Reply(text="recovered"))
    workers = [start_worker(name="a", **DEFAULT_LEASES), start_worker(name="b", **DEFAULT_LEASES)]
    services.inject(session.id, "talk", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 1, what="the model request")
    driver = driving(session, workers)
    time.sleep(0.3)  # mid-stream
    killed_at = time.time()
    driver.kill()

    wait_for(lambda: turn_ended(session), timeout=40, what="turn/end after the takeover")
    took = at(session, "turn/end") - killed_at
    print(f"two workers: turn/end {took:.2f}s after the kill")
    assert took < TAKEOVER_SECONDS, f"the survivor finished {took:.2f}s after the kill"
    assert_completed_once(session, answer="recovered")
    assert len(fake_llm.requests) == 2


def test_kill_9_of_the_only_worker_a_fresh_one_finishes_within_2s_of_being_ready(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(Reply(text="this stream never finishes", hang=True), Reply(text="recovered"))
    first = start_worker(name="a", **DEFAULT_LEASES)
    services.inject(session.id, "talk", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 1, what="the model request")
    assert driving(session, [first]) is first
    time.sleep(0.3)
    first.kill()

    started_at = time.time()
    start_worker(name="b", **DEFAULT_LEASES)
    ready_at = time.time()
    wait_for(lambda: turn_ended(session), timeout=40, what="turn/end after the takeover")
    took = at(session, "turn/end") - ready_at
    print(f"fresh worker: ready {ready_at - started_at:.2f}s after its start, turn/end {took:.2f}s after ready")
    assert took < TAKEOVER_SECONDS, f"the fresh worker finished {took:.2f}s after it was ready"
    assert_completed_once(session, answer="recovered")
    assert len(fake_llm.requests) == 2


def test_a_fresh_worker_on_celerys_own_defaults_skips_mingle_and_is_warm_before_its_first_task(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    """A worker started with none of the --without-* flags (any deploy's own
    command line): no mingle second at its start (terret_site/broker.py's
    Consumer turns it off), and the model path and the database pool warmed
    before it is ready, so the turn it recovers does not pay for them."""
    fake_llm.script(Reply(text="this stream never finishes", hang=True), Reply(text="recovered"))
    first = start_worker(name="a", **DEFAULT_LEASES)
    services.inject(session.id, "talk", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 1, what="the model request")
    time.sleep(0.3)
    first.kill()

    fresh = start_worker(name="b", flags=(), celery_cli=True, **DEFAULT_LEASES)
    wait_for(lambda: turn_ended(session), timeout=40, what="turn/end by the fresh worker")
    log = fresh.output()
    assert "mingle" not in log, log[-3000:]
    assert "Connected to" in log  # Celery's own INFO lines are there: mingle would have logged too
    assert 0 <= log.index("warm-up: the model path") < log.index(" ready."), log[-3000:]
    assert_completed_once(session, answer="recovered")
    assert len(fake_llm.requests) == 2


def test_the_procfile_and_make_dist_start_workers_through_the_launcher() -> None:
    # terret_site/worker.py builds every worker without mingle (the fresh
    # worker above is started through it, and its log has no mingle line).
    root = Path(__file__).resolve().parents[3]
    worker = next(x for x in (root / "Procfile").read_text().splitlines() if x.startswith("worker:"))
    assert worker.split()[1:4] == ["python", "-m", "terret_site.worker"], worker
    dist = (root / "Makefile").read_text().split("\ndist:", 1)[1]
    assert "$(PY) -m terret_site.worker --pool threads" in dist


def test_a_paused_worker_whose_lease_was_taken_over_writes_only_its_spend_when_it_wakes(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    # A paused process keeps its sockets, so its liveness lock stays held:
    # only the lease's expiry frees its turn. The lease is shortened here
    # (2 s, swept every 0.5 s) so the test need not wait the default 30 s.
    short = {"TERRET_LEASE_SECONDS": "2", "TERRET_SWEEP_SECONDS": "0.5"}
    fake_llm.script(Reply(text="the late answer", latency=1.0), Reply(text="recovered"))
    workers = [start_worker(name="a", **short), start_worker(name="b", **short)]
    services.inject(session.id, "talk", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 1, what="the model request")
    paused = driving(session, workers)
    paused.pause()
    try:
        wait_for(lambda: turn_ended(session), timeout=30, what="turn/end by the other worker")
        taken_over = log_of(session)
        assert_completed_once(session, answer="recovered")
    finally:
        paused.resume()
    # Its model reply has been waiting in its socket; it goes on, finds its
    # lease superseded, and writes nothing of the turn: only what its request
    # cost, unfenced, so the session's spend matches what the provider billed.
    wait_for(lambda: "'lost'" in paused.output(), timeout=30, what="the paused drive giving up")
    time.sleep(0.5)
    # The titler's after-turn work may commit after the snapshot on a busy
    # machine; it is the other worker's, not the paused one's.
    after = [e for e in log_of(session) if not _titling(e)]
    taken_over = [e for e in taken_over if not _titling(e)]
    assert after[: len(taken_over)] == taken_over
    ((_, kind, data),) = after[len(taken_over) :]
    assert kind == "usage/recorded" and data["purpose"] == "step" and data["step"] == 1
    assert data["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "cost": None}
    assert "lease was lost" in data["reason"]
    assert len(fake_llm.requests) == 2
    row = Session.objects.get(id=session.id)
    assert row.prompt_tokens + row.completion_tokens == fake_llm.tokens_sent == 30
    assert paused.proc.poll() is None, "the woken worker keeps running"


def test_sigterm_hands_a_running_turn_over_within_1s_and_reruns_no_step(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(Reply(tool_calls=[("debug.noop", {})], latency=1.0), Reply(text="done", latency=1.0))
    workers = [start_worker(name="a", **DEFAULT_LEASES), start_worker(name="b", **DEFAULT_LEASES)]
    services.inject(session.id, "two steps", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 1, what="step 1's model request")
    leaving = driving(session, workers)
    staying = next(w for w in workers if w is not leaving)
    leaving.terminate()  # mid model call: step 1 still owes its reply and its tool call

    wait_for(lambda: turn_ended(session), timeout=40, what="turn/end")
    assert leaving.wait_exit(30) == 0, leaving.output()[-3000:]
    assert not ProcessRow.objects.filter(pid=leaving.pid).exists(), "it gave its liveness key up on the way out"
    handover = at(session, "step/start", step=2) - at(session, "step/end", step=1)
    print(f"SIGTERM: step 2 started {handover:.2f}s after step 1 committed")
    assert handover < HANDOVER_SECONDS, f"step 2 started {handover:.2f}s after step 1 committed"
    assert_completed_once(session, answer="done")
    entries = log_of(session)
    assert [d["step"] for _, k, d in entries if k == "step/start"] == [1, 2]
    assert [d["step"] for _, k, d in entries if k == "step/end"] == [1, 2]
    assert [k for _, k, _ in entries].count("tool/result") == 1
    assert len(fake_llm.requests) == 2, "one model request per step: none was re-run"
    assert "'handed_off'" in leaving.output()
    assert "'ended'" in staying.output()
