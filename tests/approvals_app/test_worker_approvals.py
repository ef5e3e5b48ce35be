"""Durability of parked calls against real Celery worker processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from approvals_app import services as approvals
from approvals_app.selectors import pending
from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.effects import effects_audit
from tests.fakes.fake_llm import Reply
from tests.helpers import document_text, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def wait_until(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    return wait_for(check, timeout, what)


def data(session: Session, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(session=session, kind=kind).order_by("seq").values_list("data", flat=True))


def test_restart_while_parked(
    start_worker: Any, fake_llm: Any, make_user: Any, make_reviewer: Any, settings: Any, tmp_path: Path
) -> None:
    """A worker parks the call and is SIGKILLed; the verdict is given with no
    worker alive; a fresh worker finishes the turn without asking again."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path  # the workers inherit it
    profile = AgentProfile.objects.create(
        name="w", roles={"main": "test/model"}, builtin_tools=["workspace.write"], allow_floor=["workspace.*"]
    )
    args = {"path": "out.txt", "content": "from the second worker"}
    fake_llm.script(Reply(tool_calls=[("workspace.write", args)]), Reply(text="written"))
    session = services.create_session(make_user("owner"), profile)

    first = start_worker(name="first")
    services.run_turn(session.id, "write the file")

    def parked() -> bool:
        row = Session.objects.filter(id=session.id).values("pending_approvals", "lease_owner").get()
        return row["pending_approvals"] == 1 and row["lease_owner"] == ""

    wait_until(parked, what="the call to park and the worker to let go")
    first.kill()
    [call] = pending(session.id)
    assert (call.name, call.args) == ("workspace.write", args)

    approvals.decide(session.id, call.call_id, "approve", user=make_reviewer("rev"), request_seq=call.seq)
    time.sleep(1.0)  # no worker is alive: nothing may happen yet
    assert data(session, "tool/result") == []
    assert document_text(session.id, "out.txt") is None

    start_worker(name="second")
    wait_until(lambda: data(session, "turn/end"), what="the fresh worker to finish the turn")
    assert data(session, "turn/end") == [{"status": "completed"}]
    assert document_text(session.id, "out.txt") == "from the second worker"
    [result] = data(session, "tool/result")
    assert result["call_id"] == call.call_id and result["is_error"] is False
    [attempt] = data(session, "tool/attempt")  # approved, then run once, by the second worker
    assert (attempt["call_id"], attempt["attempt"], result["attempt"]) == (call.call_id, 1, 1)
    audit = effects_audit(session.id)
    assert audit.ok and audit.counts.get("done") == 1, audit
    assert len(data(session, "approval/requested")) == 1  # the recorded verdict was never asked again
    assert len(fake_llm.requests) == 2
    session.refresh_from_db()
    assert session.status == "idle" and session.pending_approvals == 0


def test_cancel_with_a_parked_call_under_a_worker(
    start_worker: Any, fake_llm: Any, make_user: Any, settings: Any, tmp_path: Path
) -> None:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(
        name="w", roles={"main": "test/model"}, builtin_tools=["workspace.write"], allow_floor=["*"]
    )
    fake_llm.script(Reply(tool_calls=[("workspace.write", {"path": "x", "content": "y"})]))
    session = services.create_session(make_user("owner"), profile)
    start_worker(name="w")
    services.run_turn(session.id, "write")
    wait_until(lambda: pending(session.id), what="the call to park")
    assert services.cancel(session.id, by="owner")
    wait_until(lambda: data(session, "turn/end"), what="the turn to end")
    # Closed by the cancel itself (`by`) once the worker let the parked turn
    # go, or by the worker if it still held the lease at that instant.
    assert [e["status"] for e in data(session, "turn/end")] == ["cancelled"]
    assert pending(session.id) == []
    assert [r["verdict"] for r in data(session, "approval/resolved")] == ["deny"]
    assert data(session, "tool/result")[0]["is_error"] is True
    assert document_text(session.id, "x") is None


def test_edited_arguments_run_in_a_fresh_worker(
    start_worker: Any, fake_llm: Any, make_user: Any, make_reviewer: Any, settings: Any, tmp_path: Path
) -> None:
    """The edit is in the verdict, in the log: a worker that parked the call
    is SIGKILLed, the reviewer approves with edits while no worker is alive,
    and a fresh worker process runs the reviewer's arguments (the file)."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path  # the workers inherit it
    profile = AgentProfile.objects.create(
        name="w", roles={"main": "test/model"}, builtin_tools=["workspace.write"], allow_floor=["workspace.*"]
    )
    fake_llm.script(
        Reply(tool_calls=[("workspace.write", {"path": "out.txt", "content": "the model's"})]), Reply(text="ok")
    )
    session = services.create_session(make_user("owner"), profile)
    first = start_worker(name="first")
    services.run_turn(session.id, "write the file")
    wait_until(lambda: pending(session.id), what="the call to park")
    first.kill()
    [call] = pending(session.id)
    edited = {"path": "out.txt", "content": "the reviewer's"}
    approvals.decide(session.id, call.call_id, "approve", user=make_reviewer("rev"), edited_args=edited)
    start_worker(name="second")
    wait_until(lambda: data(session, "turn/end"), what="the fresh worker to finish the turn")
    assert document_text(session.id, "out.txt") == "the reviewer's"
    [attempt] = data(session, "tool/attempt")
    assert attempt["edited"] is True and attempt["arguments"] == '{"path": "out.txt", "content": "the reviewer\'s"}'
    assert "A reviewer edited the arguments" in fake_llm.requests[1]["messages"][-1]["content"]
