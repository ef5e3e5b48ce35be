"""The effect ledger, driven in-process (TERRET_WORKER=manual).

A dead worker is simulated exactly: the test claims the session's lease,
appends what the worker would have committed up to the crash (the intent,
tool/attempt, and for some scenarios the effect itself at the target), then
abandons the lease (no renewals, its expiry in the past) and drives the
session as a fresh worker would. Executions are counted at the target
(charges.log lines, the workspace file's inode and mtime, calls of the
write), never by counting tool/result rows. The same scenarios against real
worker processes killed with SIGKILL are in test_effects_kill.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from sessions_app import log, services
from sessions_app.errors import EffectNotPending
from sessions_app.models import AgentProfile, DocumentVersion, Event, Session
from sessions_app.runtime import documents, effects, lease
from sessions_app.runtime.drive import drive
from sessions_app.runtime.effects import effects_audit
from sessions_app.services.effects import resolve
from sessions_app.tools import builtins
from sessions_app.tools.builtins import BUILTINS, CHARGES_FILE
from tests.fakes.fake_llm import Reply
from tests.helpers import events, kinds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def profile(db: None) -> AgentProfile:
    """Every tool with an effect the ledger cares about; writes need no approval."""
    return AgentProfile.objects.create(
        name="effects",
        roles={"main": "test/model"},
        builtin_tools=["workspace.write", "workspace.read", "debug.sleep", "debug.charge", "debug.noop"],
        allow_floor=["*"],
        approvals={"workspace.write": "never"},
    )


@dataclass(frozen=True)
class Crash:
    """What the dead worker left: its lease, the call, its first attempt's key."""

    held: lease.Lease
    call_id: str
    message_seq: int
    key: str


def workspace(session: Session) -> Path:
    return builtins.workspace_dir(session.id)


def charges(session: Session) -> list[dict[str, Any]]:
    """One line per execution of debug.charge, as the target recorded it."""
    path = workspace(session) / CHARGES_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def status(session: Session) -> str:
    return Session.objects.get(id=session.id).status


def crash_after_intent(session: Session, name: str, args: dict[str, Any], call_id: str = "call_1") -> Crash:
    """Open a turn and commit, under a lease of the test's own, what a worker
    commits before a non-inline tool runs (step/start, the assistant message,
    the tool/attempt); then die: the lease is abandoned where it stands."""
    services.run_turn(session.id, f"please run {name}")
    held = lease.claim(session.id)
    assert held is not None
    fence = held.fence
    log.append(session.id, "step/start", {"step": 1, "model": "test/model"}, fence=fence)
    call = {"id": call_id, "name": name, "arguments": json.dumps(args)}
    message = log.append(session.id, "assistant/message", {"content": None, "tool_calls": [call]}, fence=fence)
    key = effects.idempotency_key(session.id, message.seq, call_id)
    intent = {
        "call_id": call_id,
        "name": name,
        "attempt": 1,
        "idempotency_key": key,
        "replay": BUILTINS[name].replay_policy,
        "fence": held.gen,
        "step": 1,
        "worker": held.owner,
    }
    log.append(session.id, "tool/attempt", intent, fence=fence)
    die(session, held)
    return Crash(held, call_id, message.seq, key)


def die(session: Session, held: lease.Lease) -> None:
    """The worker is gone: nothing renews its lease, which has expired."""
    lease.keeper.drop(held)
    Session.objects.filter(id=session.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def attempts(session: Session) -> list[dict[str, Any]]:
    return events(session, "tool/attempt")


def replaced(session: Session) -> list[tuple[int, str]]:
    """What each re-run attempt says it replaces, and why."""
    return [(a["replaces"], a["why"]) for a in attempts(session) if "replaces" in a]


def results(session: Session) -> list[dict[str, Any]]:
    return events(session, "tool/result")


def tool_messages(request: dict[str, Any]) -> list[str]:
    return [m.get("content") or "" for m in request["messages"] if m.get("role") == "tool"]


def assert_audit(session: Session, **counts: int) -> None:
    """The audit is clean and counts attempts by state. An attempt a resume
    ran again (safe, or reconciled not done) is `superseded` by the next one:
    it never gets an outcome of its own, and is not in flight either."""
    audit = effects_audit(session.id)
    assert audit.ok, audit.problems
    assert audit.counts == counts


def assert_gapless(session: Session) -> None:
    seqs = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def writes(session: Session, name: str) -> list[bytes]:
    """Every version of the document, oldest first: one per execution of a
    workspace.write that took effect (counted at the target, the store)."""
    rows = DocumentVersion.objects.filter(document__session=session, document__name=name).order_by("version")
    return [bytes(v.content.data) for v in rows.select_related("content")]


# -- workspace.write: reconcile ------------------------------------------------


def test_write_crashed_before_its_effect_runs_once_more(fake_llm: Any, session: Session) -> None:
    crash = crash_after_intent(session, "workspace.write", {"path": "notes/a.txt", "content": "hello"})
    assert writes(session, "notes/a.txt") == []
    fake_llm.script(Reply(text="written"))
    assert drive(session.id) == "ended"

    assert writes(session, "notes/a.txt") == [b"hello"], "the write ran exactly once, after the reconcile said not done"
    assert [(a["attempt"], a["idempotency_key"]) for a in attempts(session)] == [(1, crash.key), (2, crash.key)]
    assert replaced(session) == [(1, "not_done")]
    (result,) = results(session)
    assert result["attempt"] == 2 and "via" not in result and not result["is_error"]
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert "tool/unknown" not in kinds(session)
    assert_gapless(session)
    assert_audit(session, done=1, superseded=1, calls=1)


def test_write_crashed_after_its_effect_is_reconciled_not_rerun(fake_llm: Any, session: Session) -> None:
    crash = crash_after_intent(session, "workspace.write", {"path": "a.txt", "content": "the intended content"})
    documents.write(session.id, "a.txt", b"the intended content")  # what the dead attempt did before it could report
    fake_llm.script(Reply(text="it was written"))
    assert drive(session.id) == "ended"

    assert writes(session, "a.txt") == [b"the intended content"], "the reconcile found the effect: no re-run"
    assert [a["attempt"] for a in attempts(session)] == [1]
    (result,) = results(session)
    assert result["attempt"] == 1 and result["via"] == "reconcile" and not result["is_error"]
    assert result["content"] == "wrote 20 bytes to a.txt"
    assert tool_messages(fake_llm.requests[-1]) == ["wrote 20 bytes to a.txt"]
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert crash.key.endswith(f":{crash.message_seq}:{crash.call_id}")
    assert_gapless(session)
    assert_audit(session, done=1, calls=1)


def test_write_over_a_different_file_is_rerun(fake_llm: Any, session: Session) -> None:
    crash = crash_after_intent(session, "workspace.write", {"path": "a.txt", "content": "new"})
    documents.write(session.id, "a.txt", b"old")  # the document held something else
    fake_llm.script(Reply(text="rewritten"))
    assert drive(session.id) == "ended"

    assert writes(session, "a.txt") == [b"old", b"new"]  # the re-run wrote its version, once
    assert [(a["attempt"], a["idempotency_key"]) for a in attempts(session)] == [(1, crash.key), (2, crash.key)]
    assert replaced(session) == [(1, "not_done")]
    (result,) = results(session)
    assert result["attempt"] == 2 and "via" not in result
    assert_gapless(session)
    assert_audit(session, done=1, superseded=1, calls=1)


# -- debug.charge: never -------------------------------------------------------


def park_unknown_charge(session: Session) -> Crash:
    """A charge whose worker died after the intent: the resume marks it
    unknown and the turn waits for an operator, without running it."""
    crash = crash_after_intent(session, "debug.charge", {"seconds": 0})
    assert drive(session.id) == "parked"
    (unknown,) = events(session, "tool/unknown")
    assert unknown["call_id"] == crash.call_id and unknown["attempt"] == 1 and unknown["name"] == "debug.charge"
    assert status(session) == "waiting_reconcile"
    assert charges(session) == []
    assert Session.objects.get(id=session.id).lease_owner == ""  # the worker parked, holding nothing
    return crash


def test_charge_crashed_after_intent_waits_for_an_operator(fake_llm: Any, session: Session) -> None:
    park_unknown_charge(session)
    before = kinds(session)
    assert drive(session.id) == "parked"  # a stray wake-up: nothing more happens
    assert kinds(session) == before
    assert charges(session) == []
    assert fake_llm.requests == []
    (effect,) = effects.effects(session.id)
    assert (effect.state, effect.replay, effect.turn_open) == ("unknown", "never", True)
    assert_audit(session, unknown=1, calls=1)


def test_charge_resolved_done_gives_the_model_the_operators_result(fake_llm: Any, session: Session) -> None:
    crash = park_unknown_charge(session)
    resolve(session.id, crash.call_id, "done", result="charged once, per the bank's statement", by="ops")
    fake_llm.script(Reply(text="thanks"))
    assert drive(session.id) == "ended"

    assert charges(session) == [], "done means the operator vouches for the effect: nothing runs"
    (result,) = results(session)
    assert result["via"] == "operator" and result["attempt"] == 1 and not result["is_error"]
    assert result["content"] == "charged once, per the bank's statement"
    assert tool_messages(fake_llm.requests[-1]) == ["charged once, per the bank's statement"]
    assert [a["attempt"] for a in attempts(session)] == [1]
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert status(session) == "idle"
    assert_gapless(session)
    assert_audit(session, resolved=1, calls=1)


def test_charge_resolved_failed_gives_an_error_result(fake_llm: Any, session: Session) -> None:
    crash = park_unknown_charge(session)
    resolve(session.id, crash.call_id, "failed", result="declined by the bank", by="ops")
    fake_llm.script(Reply(text="it failed"))
    assert drive(session.id) == "ended"

    assert charges(session) == []
    (result,) = results(session)
    assert result["via"] == "operator" and result["attempt"] == 1 and result["is_error"] is True
    assert result["content"] == "failed: marked failed by an operator (ops): declined by the bank"
    assert tool_messages(fake_llm.requests[-1]) == [result["content"]]
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert_gapless(session)
    assert_audit(session, resolved=1, calls=1)


def test_charge_resolved_rerun_charges_once_under_the_same_key(fake_llm: Any, session: Session) -> None:
    crash = park_unknown_charge(session)
    resolve(session.id, crash.call_id, "rerun", reason="the bank has no record of it", by="ops")
    fake_llm.script(Reply(text="charged"))
    assert drive(session.id) == "ended"

    (line,) = charges(session)
    assert line["attempt"] == 2 and line["idempotency_key"] == crash.key and line["call_id"] == crash.call_id
    assert [(a["attempt"], a["idempotency_key"]) for a in attempts(session)] == [(1, crash.key), (2, crash.key)]
    assert replaced(session) == [(1, "rerun")]
    (result,) = results(session)
    assert result["attempt"] == 2 and "via" not in result and not result["is_error"]
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert_gapless(session)
    assert_audit(session, resolved=1, done=1, calls=1)


def test_cancel_closes_a_turn_waiting_for_an_operator(fake_llm: Any, session: Session) -> None:
    crash = park_unknown_charge(session)
    assert services.cancel(session.id, by="owner")
    assert events(session, "turn/end") == [{"status": "cancelled", "by": "owner"}]
    assert status(session) == "idle"
    (closing,) = results(session)
    assert closing["via"] == "closing" and closing["attempt"] == 1 and closing["is_error"]
    assert len(events(session, "tool/unknown")) == 1  # marked once, by the resume, not again by the close

    (effect,) = effects.effects(session.id)
    assert (effect.state, effect.turn_open) == ("unknown", False), "what the attempt did is still unknown"
    with pytest.raises(EffectNotPending):
        resolve(session.id, crash.call_id, "rerun", by="ops")
    resolve(session.id, crash.call_id, "done", result="it went through", by="ops")
    (effect,) = effects.effects(session.id)
    assert effect.state == "resolved" and effect.resolution is not None and effect.resolution["action"] == "done"
    with pytest.raises(EffectNotPending):
        resolve(session.id, crash.call_id, "failed", by="ops")  # resolved already
    assert status(session) == "idle"
    assert drive(session.id) == "idle"
    assert charges(session) == []
    assert fake_llm.requests == []
    assert_gapless(session)
    assert_audit(session, resolved=1, calls=1)


def test_cancel_of_an_unresumed_crash_marks_the_attempt_unknown(session: Session) -> None:
    """Closed before any worker resumed it: the close itself records that
    the outcome is unknown, so the effect is still an operator's question."""
    crash = crash_after_intent(session, "debug.charge", {"seconds": 0})
    assert services.cancel(session.id, by="owner")
    (unknown,) = events(session, "tool/unknown")
    assert unknown["attempt"] == 1 and "cancelled" in unknown["reason"]
    (effect,) = effects.effects(session.id)
    assert effect.state == "unknown" and not effect.turn_open
    assert charges(session) == []
    assert_audit(session, unknown=1, calls=1)
    resolve(session.id, crash.call_id, "failed", by="ops")
    assert_audit(session, resolved=1, calls=1)


# -- debug.sleep: safe ---------------------------------------------------------


def test_safe_tool_crashed_after_intent_reruns_under_the_same_key(fake_llm: Any, session: Session) -> None:
    crash = crash_after_intent(session, "debug.sleep", {"seconds": 0.05})
    fake_llm.script(Reply(text="rested"))
    assert drive(session.id) == "ended"

    assert [(a["attempt"], a["idempotency_key"], a["replay"]) for a in attempts(session)] == [
        (1, crash.key, "safe"),
        (2, crash.key, "safe"),
    ]
    assert replaced(session) == [(1, "safe")]
    (result,) = results(session)
    assert result["attempt"] == 2 and result["content"] == "slept 0.05" and "via" not in result
    assert "tool/unknown" not in kinds(session)
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert_gapless(session)
    assert_audit(session, done=1, superseded=1, calls=1)


# -- the audit can fail ----------------------------------------------------------


def turn_with_call(session: Session, name: str = "debug.charge", call_id: str = "c1") -> int:
    """An open turn whose step called `name`; the assistant message's seq."""
    log.append(session.id, "turn/start", {})
    log.append(session.id, "step/start", {"step": 1, "model": "test/model"})
    call = {"id": call_id, "name": name, "arguments": "{}"}
    return log.append(session.id, "assistant/message", {"content": None, "tool_calls": [call]}).seq


def intent(
    session: Session, attempt: int, name: str = "debug.charge", call_id: str = "c1", seq: int = 0, why: str = ""
) -> None:
    """A tool/attempt as the runner writes it; `why` makes it a re-run of
    the attempt before (safe, not_done, rerun)."""
    data: dict[str, Any] = {
        "call_id": call_id,
        "name": name,
        "attempt": attempt,
        "idempotency_key": effects.idempotency_key(session.id, seq, call_id),
        "replay": BUILTINS[name].replay_policy,
        "fence": 0,
    }
    if why:
        data["replaces"], data["why"] = attempt - 1, why
    log.append(session.id, "tool/attempt", data)


def outcome(session: Session, attempt: int, name: str = "debug.charge", call_id: str = "c1") -> None:
    data = {"call_id": call_id, "name": name, "content": "charged", "is_error": False, "attempt": attempt}
    log.append(session.id, "tool/result", data)


def problems(session: Session) -> list[str]:
    audit = effects_audit(session.id)
    assert not audit.ok
    return audit.problems


def test_audit_fails_on_an_outcome_for_an_attempt_never_recorded(session: Session) -> None:
    seq = turn_with_call(session)
    intent(session, 1, seq=seq)
    outcome(session, 2)
    (problem,) = problems(session)
    assert "names attempt 2, which was never recorded" in problem


def test_audit_fails_on_two_outcomes_for_one_attempt(session: Session) -> None:
    seq = turn_with_call(session)
    intent(session, 1, seq=seq)
    outcome(session, 1)
    outcome(session, 1)
    (problem,) = problems(session)
    assert "a second outcome for attempt 1 of c1" in problem


def test_audit_fails_on_a_never_tool_rerun_without_an_operator(session: Session) -> None:
    seq = turn_with_call(session)
    intent(session, 1, seq=seq)
    intent(session, 2, seq=seq, why="safe")  # as if debug.charge were safe to replay
    outcome(session, 2)
    assert any("a `never` tool ran again (attempt 2) as if it were `safe`" in p for p in problems(session))

    claimed = another_session(session)  # claims an operator's rerun that no one gave
    seq = turn_with_call(claimed)
    intent(claimed, 1, seq=seq)
    log.append(claimed.id, "tool/unknown", {"call_id": "c1", "name": "debug.charge", "attempt": 1})
    intent(claimed, 2, seq=seq, why="rerun")
    assert any("claims an operator's rerun that is not on record" in p for p in problems(claimed))

    failed = another_session(session)  # an operator's `failed` is no licence to run it again
    seq = turn_with_call(failed)
    intent(failed, 1, seq=seq)
    log.append(failed.id, "tool/unknown", {"call_id": "c1", "name": "debug.charge", "attempt": 1})
    log.append(failed.id, "tool/resolved", {"call_id": "c1", "attempt": 1, "action": "failed", "by": "ops"})
    intent(failed, 2, seq=seq, why="rerun")
    assert any("claims an operator's rerun that is not on record" in p for p in problems(failed))

    silent = another_session(session)  # a second attempt that says nothing of the first
    seq = turn_with_call(silent)
    intent(silent, 1, seq=seq)
    intent(silent, 2, seq=seq)
    assert any("does not say which attempt it replaces" in p for p in problems(silent))


def test_audit_fails_on_an_attempt_in_flight_in_a_closed_turn(session: Session) -> None:
    seq = turn_with_call(session, "debug.sleep")
    intent(session, 1, "debug.sleep", seq=seq)
    assert effects_audit(session.id).ok, "in flight while its turn is open is fine"
    log.append(session.id, "turn/end", {"status": "failed", "error": "gone"})
    (problem,) = problems(session)
    assert "has no outcome, and its turn is closed" in problem


def test_audit_passes_on_a_never_tool_rerun_by_an_operator(session: Session) -> None:
    """The control for the negative tests: the same ledger with the rerun."""
    seq = turn_with_call(session)
    intent(session, 1, seq=seq)
    log.append(session.id, "tool/unknown", {"call_id": "c1", "name": "debug.charge", "attempt": 1})
    log.append(session.id, "tool/resolved", {"call_id": "c1", "attempt": 1, "action": "rerun", "by": "ops"})
    intent(session, 2, seq=seq, why="rerun")
    outcome(session, 2)
    log.append(session.id, "step/end", {"step": 1})
    log.append(session.id, "turn/end", {"status": "completed"})
    assert_audit(session, resolved=1, done=1, calls=1)


def another_session(session: Session) -> Session:
    """Another session of the same owner and profile."""
    assert session.profile is not None
    other = services.create_session(session.owner, session.profile)
    services.spawn_agent(other, session.profile)
    return other


def test_a_reused_call_id_in_a_later_step_runs_as_a_new_call(fake_llm: Any, session: Session) -> None:
    """Some providers reuse call ids across replies: the resume of a step
    whose call reuses an earlier step's id runs it as attempt 1 of a new
    call, under a key of its own, and the audit counts two calls."""
    services.run_turn(session.id, "sleep twice")
    log.append(session.id, "step/start", {"step": 1, "model": "test/model"})
    call = {"id": "c1", "name": "debug.sleep", "arguments": '{"seconds": 0}'}
    first = log.append(session.id, "assistant/message", {"content": None, "tool_calls": [call]}).seq
    intent(session, 1, "debug.sleep", seq=first)
    outcome(session, 1, "debug.sleep")
    log.append(session.id, "step/end", {"step": 1})
    log.append(session.id, "step/start", {"step": 2, "model": "test/model"})
    second = log.append(session.id, "assistant/message", {"content": None, "tool_calls": [call]}).seq
    fake_llm.script(Reply(text="slept twice"))
    assert drive(session.id) == "ended"
    assert [(a["attempt"], a["idempotency_key"]) for a in attempts(session)] == [
        (1, effects.idempotency_key(session.id, first, "c1")),
        (1, effects.idempotency_key(session.id, second, "c1")),
    ]
    assert [r["attempt"] for r in results(session)] == [1, 1]
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert_audit(session, done=2, calls=2)


@pytest.mark.usefixtures("manual_worker")
def test_one_calls_bounded_read_agrees_with_the_whole_ledger(session: Session) -> None:
    """call_effects (what a resolve reads under the row lock) gives exactly
    the attempts the full scan gives for that call, a reused id included."""
    sid = session.id
    services.run_turn(sid, "first")
    calls = [{"id": c, "name": "debug.charge", "arguments": f'{{"seconds": {n}}}'} for n, c in enumerate(["a", "b"])]
    m1 = log.append(sid, "assistant/message", {"content": None, "tool_calls": calls}).seq
    for c in ("a", "b"):
        key = f"terret:{sid}:{m1}:{c}"
        log.append(
            sid,
            "tool/attempt",
            {"call_id": c, "name": "debug.charge", "attempt": 1, "idempotency_key": key, "replay": "never", "fence": 0},
        )  # noqa: E501
    log.append(sid, "tool/result", {"call_id": "a", "name": "debug.charge", "content": "ok", "attempt": 1})
    log.append(sid, "tool/unknown", {"call_id": "b", "name": "debug.charge", "attempt": 1})
    log.append(
        sid,
        "tool/result",
        {"call_id": "b", "name": "debug.charge", "content": "x", "is_error": True, "attempt": 1, "via": "closing"},
    )  # noqa: E501
    log.append(sid, "turn/end", {"status": "cancelled"})
    services.run_turn(sid, "second")  # the provider reuses id "a" in the next turn
    m2 = log.append(sid, "assistant/message", {"content": None, "tool_calls": [calls[0]]}).seq
    log.append(
        sid,
        "tool/attempt",
        {
            "call_id": "a",
            "name": "debug.charge",
            "attempt": 1,
            "idempotency_key": f"terret:{sid}:{m2}:a",
            "replay": "never",
            "fence": 0,
        },
    )  # noqa: E501
    for c in ("a", "b"):
        assert effects.call_effects(sid, c) == [e for e in effects.effects(sid) if e.call_id == c]
    assert [(e.state, e.turn_open) for e in effects.call_effects(sid, "a")] == [("done", False), ("in_flight", True)]
    assert [(e.state, e.arguments) for e in effects.call_effects(sid, "b")] == [("unknown", '{"seconds": 1}')]
    assert effects.call_effects(sid, "nope") == []
