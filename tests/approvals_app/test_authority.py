"""An approval carries its authority (issue 31, Build 1): a verdict records
the reviewer's grounds and the policy in force, and at execution a verdict
whose reviewer lost that authority (or whose session was revoked since) is
void: the call does not run and is asked about again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from approvals_app import services as approvals
from approvals_app.selectors import pending
from sessions_app import services
from sessions_app.models import AgentProfile, Session
from sessions_app.runtime.drive import drive
from sessions_app.services import operators
from tests.approvals_app.conftest import events, kinds
from tests.fakes.fake_llm import Reply
from tests.helpers import client_for, document_text, wait_for

WRITE_A = ("workspace.write", {"path": "a.txt", "content": "hello"})


def written(session: Session, tmp_path: Path) -> bool:
    """Whether workspace.write ran: its document exists (tmp_path kept for the callers' shape)."""
    return document_text(session.id, "a.txt") is not None


def deactivate(user: Any) -> None:
    user.is_active = False
    user.save(update_fields=["is_active"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
class TestInTheLoop:
    """Through the real turn loop, driven synchronously (both databases)."""

    def test_verdict_records_grounds_and_the_policy_in_force(
        self, fake_llm: Any, session: Session, reviewer: Any
    ) -> None:
        fake_llm.script(Reply(tool_calls=[WRITE_A]))
        services.run_turn(session.id, "write it")
        assert drive(session.id) == "parked"
        [call] = pending(session.id)
        event = approvals.decide(session.id, call.call_id, "approve", user=reviewer, allow_for_session=True)
        policy = events(session, "policy/updated")
        assert len(policy) == 1
        session.refresh_from_db()
        # The policy in force at the verdict is the one appended with it.
        assert event.data["grounds"] == {
            "as": "reviewers",
            "group": "reviewers",
            "user_id": reviewer.pk,
            "policy_seq": session.policy_seq,
        }

    def test_deactivated_reviewer_approval_is_void_and_asked_again(
        self, fake_llm: Any, session: Session, make_reviewer: Any, tmp_path: Path
    ) -> None:
        fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="written"))
        services.run_turn(session.id, "write it")
        assert drive(session.id) == "parked"
        [call] = pending(session.id)
        first = make_reviewer("first")
        verdict = approvals.decide(session.id, call.call_id, "approve", user=first)
        deactivate(first)

        assert drive(session.id) == "parked"
        assert not written(session, tmp_path) and events(session, "tool/attempt") == []
        [void] = events(session, "approval/voided")
        assert void == {
            "call_id": call.call_id,
            "request_seq": call.seq,
            "verdict_seq": verdict.seq,
            "reason": "reviewer_inactive",
            "by": "first",
        }
        [again] = pending(session.id)  # asked about again: a new request for the same call
        assert again.call_id == call.call_id and again.seq > verdict.seq
        assert kinds(session, verdict.seq) == ["approval/voided", "approval/requested"]
        session.refresh_from_db()
        assert session.status == "waiting_approval" and session.pending_approvals == 1
        assert len(fake_llm.requests) == 1  # the model was not asked again, only the reviewers
        page = client_for(session.owner).get(f"/sessions/{session.id}/").content.decode()
        assert "The approval by first no longer stands (reviewer_inactive)" in page

        approvals.decide(session.id, call.call_id, "approve", user=make_reviewer("second"))
        assert drive(session.id) == "ended"
        assert written(session, tmp_path)
        [result] = events(session, "tool/result")
        assert result["is_error"] is False
        assert len(events(session, "approval/voided")) == 1

    def test_reviewer_removed_from_the_group_is_void(
        self, fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
    ) -> None:
        fake_llm.script(Reply(tool_calls=[WRITE_A]))
        services.run_turn(session.id, "write it")
        drive(session.id)
        [call] = pending(session.id)
        approvals.decide(session.id, call.call_id, "approve", user=reviewer)
        reviewer.groups.clear()
        assert drive(session.id) == "parked"
        assert [v["reason"] for v in events(session, "approval/voided")] == ["reviewer_left_group"]
        assert not written(session, tmp_path) and len(pending(session.id)) == 1

    def test_a_waiver_lapses_with_its_reviewer(
        self, fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
    ) -> None:
        """ "Allow for this session" is a standing grant: a later call of the
        tool runs on it while its reviewer may still decide, and is asked
        about again (never run) once the reviewer is deactivated."""
        write_b = ("workspace.write", {"path": "b.txt", "content": "again"})
        fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="done"), Reply(tool_calls=[write_b]))
        services.run_turn(session.id, "write it")
        assert drive(session.id) == "parked"
        [call] = pending(session.id)
        approvals.decide(session.id, call.call_id, "approve", user=reviewer, allow_for_session=True)
        assert drive(session.id) == "ended" and written(session, tmp_path)
        [policy] = events(session, "policy/updated")
        assert policy["auto_approve"] == ["workspace.write"]
        assert policy["grants"]["workspace.write"]["user_id"] == reviewer.pk

        deactivate(reviewer)
        services.run_turn(session.id, "write another")
        assert drive(session.id) == "parked"
        assert not (tmp_path / session.id.hex / "b.txt").exists()
        [again] = pending(session.id)
        assert again.name == "workspace.write"
        assert len(events(session, "tool/attempt")) == 1  # only the first call ran

    def test_revoked_and_restored_since_the_verdict_never_runs(
        self, fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
    ) -> None:
        """A verdict given before a revocation never runs, even on a session
        restored meanwhile: the revocation cancels the turn (the gate's own
        check on a later revocation is in test_gate.py)."""
        fake_llm.script(Reply(tool_calls=[WRITE_A]))
        services.run_turn(session.id, "write it")
        drive(session.id)
        [call] = pending(session.id)
        approvals.decide(session.id, call.call_id, "approve", user=reviewer)
        operators.revoke(session.id, by="ops")
        operators.restore(session.id, by="ops")
        drive(session.id)
        assert not written(session, tmp_path)
        assert [e["status"] for e in events(session, "turn/end")] == ["cancelled"]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_deactivated_before_the_call_runs_under_real_workers(
    start_worker: Any, fake_llm: Any, make_user: Any, make_reviewer: Any, settings: Any, tmp_path: Path
) -> None:
    """Done when: a reviewer approves, then is deactivated before the call
    runs: the call does not run, and it is asked about again. The worker that
    parked the call is SIGKILLed, so the approval lands with no worker alive;
    the reviewer is deactivated; a fresh worker process finds the grant dead."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path  # the workers inherit it
    profile = AgentProfile.objects.create(
        name="w", roles={"main": "test/model"}, builtin_tools=["workspace.write"], allow_floor=["workspace.*"]
    )
    fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="written"))
    session = services.create_session(make_user("owner"), profile)
    first = start_worker(name="first")
    services.run_turn(session.id, "write the file")
    wait_for(lambda: pending(session.id), 60, "the call to park")
    wait_for(lambda: Session.objects.filter(id=session.id, lease_owner="").exists(), 60, "the worker to let go")
    first.kill()
    [call] = pending(session.id)
    reviewer = make_reviewer("rev")
    approvals.decide(session.id, call.call_id, "approve", user=reviewer, request_seq=call.seq)
    deactivate(reviewer)

    start_worker(name="second")
    wait_for(lambda: events(session, "approval/voided"), 60, "the fresh worker to find the approval void")
    [again] = wait_for(lambda: pending(session.id), 30, "the call to be asked about again")
    assert again.call_id == call.call_id and again.seq > call.seq
    assert [v["reason"] for v in events(session, "approval/voided")] == ["reviewer_inactive"]
    assert events(session, "tool/attempt") == [] and events(session, "tool/result") == []
    assert not written(session, tmp_path)

    # A reviewer who holds the authority now approves: the call runs, once.
    approvals.decide(session.id, call.call_id, "approve", user=make_reviewer("rev2"), request_seq=again.seq)
    wait_for(lambda: events(session, "turn/end"), 60, "the turn to finish")
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert written(session, tmp_path)
    assert len(events(session, "tool/attempt")) == 1 and len(events(session, "approval/voided")) == 1
