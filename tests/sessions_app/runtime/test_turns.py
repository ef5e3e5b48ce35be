"""The turn loop's semantics, driven synchronously (TERRET_WORKER=manual) so
each test controls exactly when a worker runs. The model is a real local
HTTP server speaking OpenAI SSE (FakeLLM); nothing in the loop is patched.
Durability against real worker processes is in test_worker_recovery.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.errors import (
    AgentBusy,
    AgentExists,
    InvalidInput,
    TurnAlreadyRunning,
    TurnOpenInLog,
)
from sessions_app.models import Agent, AgentProfile, Event, Session
from sessions_app.runtime import hooks, lease
from sessions_app.runtime.drive import drive
from sessions_app.runtime.runner import MAX_STEPS
from tests.fakes.fake_llm import Reply, responder_for_mode
from tests.helpers import events, kinds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


def assert_gapless(session: Session) -> None:
    seqs = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    session.refresh_from_db()
    assert session.last_seq == len(seqs)


def test_text_turn_runs_start_step_end(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="hello there", usage=(12, 3, 0.0004)))
    services.run_turn(session.id, "hi")
    assert drive(session.id) == "ended"
    assert kinds(session)[1:] == [
        "turn/start", "user/message", "step/start", "assistant/message", "step/end", "turn/end",
    ]  # fmt: skip
    assert events(session, "step/start") == [{"step": 1, "model": "test/model"}]
    assert events(session, "step/end")[0]["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "cost": 0.0004}
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert events(session, "assistant/message")[0]["content"] == "hello there"
    session.refresh_from_db()
    assert session.status == "idle" and session.steps == 1 and session.prompt_tokens == 12
    # the model saw the system prompt and the user's message
    assert fake_llm.requests[0]["messages"][-1] == {"role": "user", "content": "hi"}
    assert_gapless(session)


def test_tool_call_then_final_answer(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(tool_calls=[("debug.noop", {})]), Reply(text="all done"))
    services.run_turn(session.id, "do it")
    drive(session.id)
    results = events(session, "tool/result")
    assert len(results) == 1 and results[0]["content"] == "ok" and results[0]["is_error"] is False
    assert [e["step"] for e in events(session, "step/end")] == [1, 2]
    assert events(session, "turn/end") == [{"status": "completed"}]
    # the second request carried the tool result back in OpenAI format
    second = fake_llm.requests[1]["messages"]
    assert second[-1]["role"] == "tool" and second[-2]["tool_calls"][0]["function"]["name"] == "debug__noop"


def test_unknown_tool_and_bad_arguments_become_error_results(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(tool_calls=[("no.such", {}), ("debug.sleep", {"seconds": "x"})]), Reply(text="ok"))
    services.run_turn(session.id, "go")
    drive(session.id)
    results = events(session, "tool/result")
    assert [r["is_error"] for r in results] == [True, True]
    assert "unknown tool" in results[0]["content"]
    assert events(session, "turn/end") == [{"status": "completed"}]


def test_26th_step_fails_the_turn(fake_llm: Any, session: Session) -> None:
    fake_llm.responder = responder_for_mode("always-tool", "debug.noop")
    services.run_turn(session.id, "loop forever")
    drive(session.id)
    starts = events(session, "step/start")
    assert [s["step"] for s in starts] == list(range(1, MAX_STEPS + 1))
    end = events(session, "turn/end")
    assert len(end) == 1 and end[0]["status"] == "failed" and "25" in end[0]["error"]
    assert len(fake_llm.requests) == MAX_STEPS


def test_model_failure_fails_a_fresh_turn(fake_llm: Any, session: Session, settings: Any) -> None:
    settings.TERRET_LLM_RETRIES = 0
    fake_llm.script(Reply(status=400, error_message="bad model"))
    services.run_turn(session.id, "hi")
    drive(session.id)
    end = events(session, "turn/end")
    assert end[0]["status"] == "failed" and "bad model" in end[0]["error"]
    session.refresh_from_db()
    assert session.status == "idle"


def test_run_turn_refuses_open_turns_and_appends_nothing(fake_llm: Any, session: Session) -> None:
    services.run_turn(session.id, "first")
    before = kinds(session)
    # open turn, nobody holds the lease: a crashed turn that must be resumed
    with pytest.raises(TurnOpenInLog):
        services.run_turn(session.id, "second")
    held = lease.claim(session.id)
    assert held is not None
    with pytest.raises(TurnAlreadyRunning):
        services.run_turn(session.id, "third")
    lease.release(held)
    assert kinds(session) == before
    with pytest.raises(InvalidInput):
        services.run_turn(session.id, "   ")


def test_parked_agent_refuses_a_new_turn(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(tool_calls=[("workspace.write", {"path": "a.txt", "content": "x"})]))
    services.run_turn(session.id, "write")
    assert drive(session.id) == "parked"
    session.refresh_from_db()
    assert session.status == "waiting_approval" and session.lease_owner == ""
    before = kinds(session)
    with pytest.raises(TurnAlreadyRunning):
        services.run_turn(session.id, "again")
    assert kinds(session) == before


def test_wake_inject_starts_then_queues_and_rides_the_next_step(fake_llm: Any, session: Session) -> None:
    first = services.inject(session.id, "start please", wake=True)
    assert first.disposition == "started"
    second = services.inject(session.id, "and also this", wake=True)
    assert second.disposition == "queued"
    fake_llm.script(Reply(text="done"))
    drive(session.id)
    assert kinds(session).count("turn/start") == 1
    injected = events(session, "context/injected")
    assert injected == [{"text": "and also this", "source_seq": second.seq}]
    # the steer reached the model in the first step
    contents = [m.get("content") for m in fake_llm.requests[0]["messages"]]
    assert "and also this" in contents


def test_non_waking_input_waits_for_the_next_turn(fake_llm: Any, session: Session) -> None:
    queued = services.inject(session.id, "note for later", wake=False)
    assert queued.disposition == "queued"
    assert drive(session.id) == "idle"
    assert "turn/start" not in kinds(session)
    services.run_turn(session.id, "now go")
    fake_llm.script(Reply(text="ok"))
    drive(session.id)
    ks = kinds(session)
    # queued input keeps its place before the new message
    assert ks.index("context/injected") < ks.index("user/message")


def test_wake_arriving_after_turn_end_starts_next_turn(fake_llm: Any, session: Session) -> None:
    release = threading.Event()
    fake_llm.script(Reply(text="slow", hang=release), Reply(text="second turn"))
    services.run_turn(session.id, "one")
    t = threading.Thread(target=drive, args=(session.id,))
    t.start()
    while len(fake_llm.requests) < 1:
        threading.Event().wait(0.01)
    # the agent is running: this wake is queued and must not be lost
    receipt = services.inject(session.id, "two", wake=True)
    assert receipt.disposition == "queued"
    release.set()
    t.join(10)
    # the step had already started, so the wake could not ride it: the
    # running driver notices it after turn/end and opens the next turn with it
    assert kinds(session).count("turn/start") == 2
    assert [e["status"] for e in events(session, "turn/end")] == ["completed", "completed"]
    assert events(session, "user/message")[1] == {"text": "two", "source_seq": receipt.seq}


def test_idempotent_inject(fake_llm: Any, session: Session) -> None:
    from sessions_app.errors import IdempotencyConflict

    a = services.inject(session.id, "hello", wake=True, idempotency_key="k1")
    b = services.inject(session.id, "hello", wake=True, idempotency_key="k1")
    assert b.replayed and (b.disposition, b.seq, b.turn_seq) == (a.disposition, a.seq, a.turn_seq)
    before = kinds(session)
    with pytest.raises(IdempotencyConflict):
        services.inject(session.id, "different", wake=True, idempotency_key="k1")
    assert kinds(session) == before


def test_pre_step_hook_rejects_the_turn(fake_llm: Any, session: Session) -> None:
    def refuse(ctx: hooks.StepContext) -> str | None:
        return "budget exhausted" if ctx.session_id == session.id else None

    hooks.register_pre_step(refuse)
    try:
        services.run_turn(session.id, "hi")
        drive(session.id)
    finally:
        hooks.pre_step.remove(refuse)
    assert events(session, "turn/end") == [{"status": "rejected", "error": "budget exhausted"}]
    assert fake_llm.requests == []


# -- resume edges -----------------------------------------------------------


def crash_log(session: Session, *entries: tuple[str, dict[str, Any]]) -> None:
    """Write the log a dead worker would have left behind."""
    for kind, data in entries:
        log.append(session.id, kind, data)


def test_resume_after_crash_mid_stream_keeps_unclosed_step(fake_llm: Any, session: Session) -> None:
    crash_log(session, ("turn/start", {}), ("user/message", {"text": "hi"}), ("step/start", {"step": 1, "model": "m"}))
    assert services.resumable(session.id)
    fake_llm.script(Reply(text="recovered"))
    assert drive(session.id) == "ended"
    assert kinds(session).count("turn/start") == 1
    assert [s["step"] for s in events(session, "step/start")] == [1, 2]
    assert [s["step"] for s in events(session, "step/end")] == [2]  # step 1 stays unclosed
    assert events(session, "turn/end") == [{"status": "completed"}]


def test_resume_after_final_message_makes_one_more_request(fake_llm: Any, session: Session) -> None:
    crash_log(
        session,
        ("turn/start", {}),
        ("user/message", {"text": "hi"}),
        ("step/start", {"step": 1, "model": "m"}),
        ("assistant/message", {"content": "the answer", "tool_calls": []}),
    )
    fake_llm.script(Reply(text="wrapping up"))
    drive(session.id)
    assert len(fake_llm.requests) == 1
    assert fake_llm.requests[0]["messages"][-1] == {"role": "assistant", "content": "the answer"}
    assert [s["step"] for s in events(session, "step/end")] == [1, 2]
    assert "usage" not in events(session, "step/end")[0]
    assert events(session, "turn/end") == [{"status": "completed"}]


def test_resume_before_first_step_closes_empty(fake_llm: Any, session: Session) -> None:
    crash_log(session, ("turn/start", {}))
    assert drive(session.id) == "ended"
    assert events(session, "turn/end") == [{"status": "empty"}]
    assert fake_llm.requests == []


def test_resume_reexecutes_owed_tool_call_once(fake_llm: Any, session: Session) -> None:
    call = {"id": "c1", "name": "workspace.write", "arguments": '{"path": "f.txt", "content": "v"}'}
    profile = session.profile
    assert profile is not None
    profile.approvals = {"workspace.write": "never"}
    profile.save()
    crash_log(
        session,
        ("turn/start", {}),
        ("user/message", {"text": "write"}),
        ("step/start", {"step": 1, "model": "m"}),
        ("assistant/message", {"content": None, "tool_calls": [call]}),
    )
    fake_llm.script(Reply(text="written"))
    drive(session.id)
    results = events(session, "tool/result")
    assert len(results) == 1 and results[0]["call_id"] == "c1" and not results[0]["is_error"]
    assert kinds(session).count("turn/start") == 1
    assert events(session, "turn/end") == [{"status": "completed"}]


def test_failed_resume_leaves_the_turn_open(fake_llm: Any, session: Session, settings: Any) -> None:
    settings.TERRET_LLM_RETRIES = 0
    crash_log(session, ("turn/start", {}), ("user/message", {"text": "hi"}), ("step/start", {"step": 1, "model": "m"}))
    fake_llm.script(Reply(status=503))
    assert drive(session.id) == "resume_failed"
    assert "turn/end" not in kinds(session)
    (stalled,) = events(session, "turn/stalled")
    assert stalled["attempt"] == 1 and stalled["retry_in"] == settings.TERRET_RESUME_BACKOFF_SECONDS
    assert "HTTP 503" in stalled["error"]
    assert services.resumable(session.id)
    # the next stimulus resumes it
    fake_llm.script(Reply(text="back"))
    services.inject(session.id, "are you there?", wake=True)
    drive(session.id)
    assert events(session, "turn/end") == [{"status": "completed"}]


# -- lease and fencing ---------------------------------------------------------


def test_superseded_lease_can_append_nothing(session: Session, settings: Any) -> None:
    first = lease.claim(session.id, ttl=0.5)
    assert first is not None
    lease.keeper.drop(first)  # simulate a stalled worker: no renewals
    assert lease.claim(session.id) is None  # still held
    threading.Event().wait(0.6)
    second = lease.claim(session.id)
    assert second is not None and second.gen == first.gen + 1
    before = kinds(session)
    with pytest.raises(log.LeaseLost):
        log.append(session.id, "turn/start", {}, fence=first.fence)
    assert kinds(session) == before
    log.append(session.id, "turn/start", {}, fence=second.fence)
    lease.release(second)


def test_duplicate_delivery_runs_one_turn_and_one_model_call_per_step(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="slow answer", latency=0.5))
    services.run_turn(session.id, "hi")
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda: outcomes.append(drive(session.id))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["busy", "ended"]
    assert len(fake_llm.requests) == 1
    assert kinds(session).count("step/start") == 1 and kinds(session).count("turn/end") == 1


# -- agents --------------------------------------------------------------------


def test_agent_registry_rules(make_user: Any, profile: AgentProfile, settings: Any) -> None:
    user = make_user()
    s1 = services.create_session(user, profile, agent_id="alpha")
    with pytest.raises(AgentExists):
        services.create_session(user, profile, agent_id="alpha")
    with pytest.raises(AgentExists):
        services.spawn_agent(s1, profile, agent_id="beta")
    services.run_turn(s1.id, "busy")
    with pytest.raises(AgentBusy):
        services.dispose_agent("alpha")
    log.append(s1.id, "turn/end", {"status": "cancelled"})
    services.dispose_agent("alpha")
    assert events(s1, "agent/disposed") == [{"agent_id": "alpha", "reason": "operator"}]
    assert not Agent.objects.filter(session=s1).exists()


def test_waking_with_queued_input_keeps_arrival_order(fake_llm: Any, session: Session) -> None:
    # Queued input makes the one-statement admission step aside: the locked
    # path opens the turn with the queued text first, then the new one.
    queued = services.inject(session.id, "note for later", wake=False)
    started = services.inject(session.id, "now go", wake=True)
    assert started.disposition == "started"
    fake_llm.script(Reply(text="ok"))
    assert drive(session.id) == "ended"
    ks = kinds(session)
    assert ks.count("turn/start") == 1
    assert events(session, "context/injected") == [{"text": "note for later", "source_seq": queued.seq}]
    assert ks.index("context/injected") < ks.index("user/message")
    assert [m.get("content") for m in fake_llm.requests[0]["messages"][-2:]] == ["note for later", "now go"]


def test_a_repointed_main_role_is_used_by_the_next_step(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    services.run_turn(session.id, "first")
    drive(session.id)
    services.set_model(session.id, "main", "other/model")
    assert Session.objects.get(id=session.id).model_main == "other/model"
    services.run_turn(session.id, "second")
    drive(session.id)
    assert [e["model"] for e in events(session, "step/start")] == ["test/model", "other/model"]
    assert [r["model"] for r in fake_llm.requests] == ["test/model", "other/model"]


def test_the_runner_hands_post_turn_what_it_knows(fake_llm: Any, session: Session, profile: AgentProfile) -> None:
    from sessions_app.runtime.drive import _drive

    fake_llm.script(
        Reply(tool_calls=[("debug.noop", "{}")], usage=(11, 2, 0.0)), Reply(text="done", usage=(42, 3, 0.0))
    )
    services.run_turn(session.id, "  count the tokens  ")
    outcome, facts = _drive(session.id)
    assert outcome == "ended" and facts is not None
    assert facts.profile.pk == profile.pk
    assert facts.titled is False
    assert facts.first_user_text == "count the tokens"
    assert facts.last_prompt_tokens == 42  # the last step's, not the first's
    assert facts.over_budget is False


def test_local_calls_ride_one_commit_with_the_step_tail(fake_llm: Any, session: Session) -> None:
    """A step whose calls are all local (fast, read-only, idempotent) commits
    its assistant message with the results and the next step/start: one
    statement, so they share a timestamp. A step that calls anything else
    commits the message before the tool runs, then the call's intent
    (tool/attempt); the inline call in that step needs none."""
    fake_llm.script(
        Reply(tool_calls=[("clock.now", {}), ("debug.noop", {})]),
        Reply(tool_calls=[("debug.sleep", {"seconds": 0.05}), ("debug.noop", {})]),
        Reply(text="done"),
    )
    services.run_turn(session.id, "go")
    assert drive(session.id) == "ended"
    rows = list(Event.objects.filter(session=session).order_by("seq").values_list("kind", "data", "created_at"))
    assert [k for k, _, _ in rows] == [
        "agent/spawned", "turn/start", "user/message",
        "step/start", "assistant/message", "tool/result", "tool/result", "step/end",
        "step/start", "assistant/message", "tool/attempt", "tool/result", "tool/result", "step/end",
        "step/start", "assistant/message", "step/end", "turn/end",
    ]  # fmt: skip
    at = [t for _, _, t in rows]
    assert at[4] == at[5] == at[6] == at[7] == at[8]  # step 1: one commit, after the local calls
    assert at[9] < at[10] < at[11]  # step 2 calls debug.sleep: its message, then its intent, then the run
    attempt = rows[10][1]
    assert attempt["call_id"] == rows[9][1]["tool_calls"][0]["id"] and attempt["attempt"] == 1
    assert attempt["replay"] == "safe" and rows[11][1]["attempt"] == 1
    assert "attempt" not in rows[12][1]  # debug.noop ran inline: no intent, nothing to close
    assert [d["is_error"] for k, d, _ in rows if k == "tool/result"] == [False] * 4


def test_refresh_catches_up_past_one_page_of_foreign_events(session: Session, monkeypatch: Any) -> None:
    """The runner reads what others committed in pages; it reads them all
    (a policy/updated beyond the first page must still be seen)."""
    from sessions_app.runtime import runner as loop
    from sessions_app.runtime import view

    monkeypatch.setattr(view, "REFRESH_PAGE", 2)
    services.run_turn(session.id, "go")
    held = lease.claim(session.id)
    assert held is not None and held.driving.profile is not None and held.workload.open_turn_seq is not None
    try:
        runner = loop.TurnRunner(session.id, held.driving.profile, held)
        runner.view.load(held.workload.open_turn_seq)
        for text in ("a", "b", "c", "d"):
            log.append(session.id, "input/queued", {"text": text, "wake": False})
        policy = log.append(session.id, "policy/updated", {"patterns": ["clock.*"], "by": "owner"})
        runner.view.refresh()
        assert runner.view.seen == policy.seq and runner.view.policy_seq == policy.seq
    finally:
        lease.release(held)
