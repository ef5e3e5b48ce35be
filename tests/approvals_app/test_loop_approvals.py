"""Approvals through the real turn loop, driven synchronously
(TERRET_WORKER=manual). The model is FakeLLM; nothing in the loop is patched."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from approvals_app import services as approvals
from approvals_app.selectors import pending
from sessions_app import log, services
from sessions_app.errors import TurnClosed
from sessions_app.log import AppendedEvent, fanout, on_event
from sessions_app.models import AgentProfile, Session
from sessions_app.runtime.drive import drive
from tests.approvals_app.conftest import events, kinds, park
from tests.fakes.fake_llm import Reply
from tests.helpers import document_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

WRITE_A = ("workspace.write", {"path": "a.txt", "content": "hello"})
WRITE_B = ("workspace.write", {"path": "b.txt", "content": "world"})


def workspace(session: Session, tmp_path: Path) -> Path:
    return tmp_path / session.id.hex


def test_mutating_call_parks_and_holds_no_worker(fake_llm: Any, session: Session, tmp_path: Path) -> None:
    fake_llm.script(Reply(tool_calls=[WRITE_A]))
    services.run_turn(session.id, "write it")
    assert drive(session.id) == "parked"
    [call] = pending(session.id)
    assert (call.name, call.args) == WRITE_A
    requested = events(session, "approval/requested")
    assert requested == [{"call_id": call.call_id, "name": "workspace.write", "args": WRITE_A[1]}]
    session.refresh_from_db()
    assert session.status == "waiting_approval" and session.pending_approvals == 1
    assert session.lease_owner == ""  # the drive returned: no worker is held while parked
    assert document_text(session.id, "a.txt") is None
    assert len(fake_llm.requests) == 1
    # Driving again while parked does nothing and asks nothing again.
    assert drive(session.id) == "parked"
    assert len(events(session, "approval/requested")) == 1 and len(fake_llm.requests) == 1


def test_approve_resumes_and_is_never_asked_again(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="written"))
    services.run_turn(session.id, "write it")
    drive(session.id)
    [call] = pending(session.id)
    approvals.decide(session.id, call.call_id, "approve", user=reviewer, reason="fine")
    assert pending(session.id) == []
    # A fresh drive (a "restarted" worker: new lease, state only from the log).
    assert drive(session.id) == "ended"
    assert document_text(session.id, "a.txt") == "hello"
    [result] = events(session, "tool/result")
    assert result["call_id"] == call.call_id and result["is_error"] is False and "wrote" in result["content"]
    assert events(session, "approval/resolved") == [
        {
            "call_id": call.call_id,
            "verdict": "approve",
            "reason": "fine",
            "by": "rev",
            "grounds": {"as": "reviewers", "group": "reviewers", "user_id": reviewer.pk, "policy_seq": None},
        }
    ]
    assert len(events(session, "approval/requested")) == 1
    assert events(session, "turn/end") == [{"status": "completed"}]
    # The tool result reached the model.
    assert fake_llm.requests[1]["messages"][-1]["role"] == "tool"


def test_deny_becomes_an_error_result_and_the_turn_goes_on(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="ok, I won't"))
    services.run_turn(session.id, "write it")
    drive(session.id)
    [call] = pending(session.id)
    approvals.decide(session.id, call.call_id, "deny", user=reviewer, reason="not today")
    assert drive(session.id) == "ended"
    [result] = events(session, "tool/result")
    assert result["is_error"] is True and result["content"] == "denied: not today"
    assert document_text(session.id, "a.txt") is None
    assert events(session, "turn/end") == [{"status": "completed"}]


def test_never_and_always_overrides(fake_llm: Any, session: Session, profile: AgentProfile) -> None:
    profile.approvals = {"workspace.write": "never", "debug.noop": "always"}
    profile.save()
    fake_llm.script(Reply(tool_calls=[WRITE_A, ("debug.noop", {}), ("clock.now", {})]))
    services.run_turn(session.id, "go")
    assert drive(session.id) == "parked"
    # write ran without asking, clock.now (never) ran, noop (always) asks.
    assert [c.name for c in pending(session.id)] == ["debug.noop"]
    assert sorted(r["name"] for r in events(session, "tool/result")) == ["clock.now", "workspace.write"]


def test_a_vetoed_call_never_reaches_the_gate(fake_llm: Any, session: Session, profile: AgentProfile) -> None:
    profile.allow_floor = ["clock.*"]
    profile.save()
    fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="ok"))
    services.run_turn(session.id, "write")
    assert drive(session.id) == "ended"
    assert events(session, "approval/requested") == []
    [result] = events(session, "tool/result")
    assert result["is_error"] and result["content"].startswith("vetoed:")


def test_two_calls_park_together_and_each_runs_on_its_own_verdict(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    fake_llm.script(Reply(tool_calls=[WRITE_A, WRITE_B]), Reply(text="done"))
    services.run_turn(session.id, "write both")
    drive(session.id)
    a, b = pending(session.id)
    approvals.decide(session.id, a.call_id, "approve", user=reviewer)
    assert drive(session.id) == "parked"  # a ran; b still waits
    assert document_text(session.id, "a.txt") is not None
    assert [c.call_id for c in pending(session.id)] == [b.call_id]
    approvals.decide(session.id, b.call_id, "deny", user=reviewer)
    assert drive(session.id) == "ended"
    assert [(r["call_id"], r["is_error"]) for r in events(session, "tool/result")] == [
        (a.call_id, False),
        (b.call_id, True),
    ]
    assert len(events(session, "approval/requested")) == 2  # nobody was asked twice


def test_call_id_reused_in_a_later_turn_is_asked_again(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    args = {"path": "a.txt", "content": "x"}
    first = park(session.id, "c1", args=args)
    approvals.decide(session.id, "c1", "approve", user=reviewer, request_seq=first)
    fake_llm.script(Reply(text="done"))
    assert drive(session.id) == "ended"
    # Turn 2: the provider hands out the same id for the same arguments.
    second = park(session.id, "c1", args=args)
    assert [c.seq for c in pending(session.id)] == [second]
    # A stale click on the first turn's request does not decide the new one.
    with pytest.raises(TurnClosed):
        approvals.decide(session.id, "c1", "approve", user=reviewer, request_seq=first)
    assert [c.seq for c in pending(session.id)] == [second]


def test_call_id_reused_in_a_later_step_is_asked_again(fake_llm: Any, session: Session, reviewer: Any) -> None:
    args = {"path": "a.txt", "content": "x"}
    park(session.id, "c1", args=args)
    approvals.decide(session.id, "c1", "approve", user=reviewer)
    fake_llm.script(Reply(text="never reached"))
    # Run the approved call, then hand-build step 2 reusing id and arguments.
    with log.locked(session.id) as tx:
        tx.append("tool/result", {"call_id": "c1", "name": "workspace.write", "content": "wrote", "is_error": False})
        tx.append("step/end", {"step": 1})
        tx.append("step/start", {"step": 2, "model": "test/model"})
        tx.append("assistant/message", {"content": None, "tool_calls": [
            {"id": "c1", "name": "workspace.write", "arguments": json.dumps(args)}]})  # fmt: skip
    assert drive(session.id) == "parked"
    assert len(events(session, "approval/requested")) == 2
    assert len(pending(session.id)) == 1


def test_a_verdict_for_other_arguments_does_not_apply(fake_llm: Any, session: Session, reviewer: Any) -> None:
    # The open step's message calls c1 with B, but the log holds an approved
    # request for c1 with A (a request the loop never made for this message).
    with log.locked(session.id) as tx:
        tx.append("turn/start", {})
        tx.append("user/message", {"text": "go"})
        tx.append("step/start", {"step": 1, "model": "test/model"})
        tx.append("assistant/message", {"content": None, "tool_calls": [
            {"id": "c1", "name": "workspace.write", "arguments": json.dumps(WRITE_B[1])}]})  # fmt: skip
        tx.append("approval/requested", {"call_id": "c1", "name": "workspace.write", "args": WRITE_A[1]})
        tx.append("approval/resolved", {"call_id": "c1", "verdict": "approve"})
    assert drive(session.id) == "parked"
    [call] = pending(session.id)
    assert call.args == WRITE_B[1]
    assert events(session, "tool/result") == []


def test_verdict_landing_while_the_parking_worker_holds_the_lease(
    fake_llm: Any, session: Session, reviewer: Any
) -> None:
    """The verdict commits before the drive that parked releases its lease, so
    its wake-up would find the lease busy; the drive itself must notice."""

    before = list(fanout._listeners)

    @on_event("approval/requested")
    def decide_at_once(event: AppendedEvent) -> None:
        approvals.decide(event.session_id, event.data["call_id"], "approve", user=reviewer)

    try:
        fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="done"))
        services.run_turn(session.id, "write")
        assert drive(session.id) == "ended"  # one drive call: no second wake-up needed
    finally:
        fanout._listeners[:] = before
    assert events(session, "turn/end") == [{"status": "completed"}]


def test_cancel_with_parked_calls(fake_llm: Any, session: Session, reviewer: Any) -> None:
    fake_llm.script(Reply(tool_calls=[WRITE_A, WRITE_B]))
    services.run_turn(session.id, "write both")
    drive(session.id)
    a, b = pending(session.id)
    assert services.cancel(session.id, by="owner") is True
    # Marked cancelled first, then every standing request durably denied.
    assert kinds(session)[-7:-4] == ["turn/cancel_requested", "approval/resolved", "approval/resolved"]
    assert events(session, "approval/resolved") == [
        {"call_id": a.call_id, "verdict": "deny", "reason": "turn cancelled", "by": "owner"},
        {"call_id": b.call_id, "verdict": "deny", "reason": "turn cancelled", "by": "owner"},
    ]
    assert pending(session.id) == []
    with pytest.raises(TurnClosed):  # no worker holds a parked turn, so the cancel closed it at once
        approvals.decide(session.id, a.call_id, "approve", user=reviewer)
    assert kinds(session)[-4:] == ["tool/result", "tool/result", "step/end", "turn/end"]
    assert events(session, "turn/end") == [{"status": "cancelled", "by": "owner"}]
    assert drive(session.id) == "idle"
    assert all(r["is_error"] for r in events(session, "tool/result"))
    session.refresh_from_db()
    assert session.status == "idle" and session.pending_approvals == 0
    # Nothing dangles for a later resume.
    assert pending(session.id) == []
    with pytest.raises(TurnClosed):
        approvals.decide(session.id, a.call_id, "approve", user=reviewer)
    assert len(fake_llm.requests) == 1


def test_cancel_while_the_model_streams_leaves_no_request_behind(
    fake_llm: Any, session: Session, settings: Any
) -> None:
    """cancel() lands while the worker waits on the model; the reply then asks
    for a mutating call. No approval/requested may follow the cancel."""
    # The reply must win the race with the stop watch here (which would cut
    # the stream: test_turns_end.py covers that path), so the watch does not
    # look again before the reply is in.
    settings.TERRET_CANCEL_POLL_SECONDS = 3600
    release = threading.Event()
    fake_llm.script(Reply(text="thinking", tool_calls=[WRITE_A], hang=release))
    services.run_turn(session.id, "write")
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(drive(session.id)))
    worker.start()
    try:
        for _ in range(200):
            if fake_llm.requests:
                break
            threading.Event().wait(0.02)
        assert services.cancel(session.id) is True
    finally:
        release.set()
        worker.join(30)
    assert outcome == ["ended"]
    assert "approval/requested" not in kinds(session)
    [result] = events(session, "tool/result")
    assert result["is_error"] and "cancelled" in result["content"]
    assert events(session, "turn/end") == [{"status": "cancelled"}]
    session.refresh_from_db()
    assert session.pending_approvals == 0 and session.status == "idle"
