"""Operators' actions: suspension of admission at each scope (held input, a
running turn parked at its next step boundary, in every worker process),
resume, revoke and restore, abandon; each in the operators' log with its
actor and reason. Model requests are counted at the fake server."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from sessions_app import log, services
from sessions_app.errors import InvalidInput, LeaseLost, NotAbandonable, SessionRevoked
from sessions_app.models import AgentProfile, OperatorAction, Session
from sessions_app.runtime import lease, limits
from sessions_app.runtime.drive import drive
from sessions_app.services import operators
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def status(session: Session) -> str:
    return Session.objects.get(id=session.id).status


@pytest.mark.usefixtures("manual_worker")
@pytest.mark.parametrize("scope", ["session", "profile", "global"])
def test_suspension_holds_input_and_resume_runs_it(scope: str, fake_llm: Any, session: Session) -> None:
    target = {"session": str(session.id), "profile": session.profile.name, "global": ""}[scope]  # type: ignore[union-attr]
    operators.suspend(scope, target, by="ops", reason="incident 42")
    receipt = services.inject(session.id, "hello", wake=True)
    assert receipt.disposition == "held" and "suspended" in (receipt.held_reason or "")
    (held,) = events(session, "input/held")
    assert held["reason"] == {"hold": "suspended", "scope": scope, **({"by": "ops"} if scope != "session" else {})}
    assert drive(session.id) == "idle" and len(fake_llm.requests) == 0
    fake_llm.script(Reply(text="back"))
    operators.resume(scope, target, by="ops", reason="fixed")
    assert drive(session.id) == "ended"
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert len(fake_llm.requests) == 1
    actions = list(OperatorAction.objects.order_by("at").values_list("actor", "action", "scope", "target", "reason"))
    assert actions == [("ops", "suspend", scope, target, "incident 42"), ("ops", "resume", scope, target, "fixed")]


@pytest.mark.usefixtures("manual_worker")
def test_a_running_turn_parks_at_its_next_step_boundary_and_goes_on_when_resumed(
    fake_llm: Any, session: Session
) -> None:
    def suspend_during_the_call(body: dict[str, Any]) -> Reply:
        if not any(m.get("role") == "tool" for m in body["messages"]):
            operators.suspend("session", str(session.id), by="ops", reason="hold it")
            return Reply(tool_calls=[("debug.sleep", {"seconds": 0})])
        return Reply(text="finished after the resume")

    fake_llm.responder = suspend_during_the_call
    services.run_turn(session.id, "go")
    assert drive(session.id) == "suspended"
    assert status(session) == "suspended"
    assert len(fake_llm.requests) == 1, "no model call past the step boundary"
    assert events(session, "turn/end") == []
    assert Session.objects.get(id=session.id).lease_owner == "", "a parked turn holds no worker"
    operators.resume("session", str(session.id), by="ops")
    assert drive(session.id) == "ended"
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert len(fake_llm.requests) == 2


@pytest.mark.worker
def test_a_profile_suspension_reaches_every_worker_process(
    start_worker: Any, fake_llm: Any, make_user: Any, settings: Any, tmp_path: Any
) -> None:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(
        name="ops-p", roles={"main": "test/model"}, builtin_tools=["debug.sleep"], allow_floor=["*"]
    )
    session = services.create_session(make_user(), profile)
    fake_llm.script(
        Reply(tool_calls=[("debug.sleep", {"seconds": 2})]), Reply(text="resumed and done"), Reply(text="second")
    )
    start_worker(name="a")
    start_worker(name="b")
    services.inject(session.id, "work", wake=True)
    wait_for(lambda: events(session, "tool/attempt"), what="the tool running")
    operators.suspend("profile", "ops-p", by="ops", reason="budget review")  # read by the workers within a second
    wait_for(
        lambda: Session.objects.filter(id=session.id, lease_owner="").exists() and events(session, "tool/result"),
        timeout=20,
        what="the turn parking at its next step boundary",
    )
    assert len(fake_llm.requests) == 1 and events(session, "turn/end") == []
    held = services.inject(session.id, "and this?", wake=True)
    assert held.disposition == "queued"  # a turn is open: it rides that turn once it runs again
    operators.resume("profile", "ops-p", by="ops")
    wait_for(lambda: events(session, "turn/end"), timeout=20, what="the parked turn going on")
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert len(fake_llm.requests) == 2


@pytest.mark.usefixtures("manual_worker")
def test_revoke_cancels_denies_and_refuses_until_restored(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(tool_calls=[("workspace.write", {"path": "x.txt", "content": "no"})]), Reply(text="ok"))
    services.run_turn(session.id, "write")
    held = lease.claim(session.id)
    assert held is not None
    operators.revoke(session.id, by="ops", reason="leaked key")
    lease.release(held)
    assert drive(session.id) == "ended"
    (end,) = events(session, "turn/end")
    assert end["status"] == "cancelled"
    assert len(fake_llm.requests) == 0
    assert status(session) == "idle" and Session.objects.get(id=session.id).revoked_seq is not None
    with pytest.raises(SessionRevoked):
        services.inject(session.id, "more", wake=True)
    operators.restore(session.id, by="ops", reason="rotated")
    assert services.inject(session.id, "more", wake=True).disposition == "started"
    assert [d["by"] for d in events(session, "session/revoked") + events(session, "session/restored")] == [
        "ops",
        "ops",
    ]


@pytest.mark.usefixtures("manual_worker")
def test_a_revoked_session_denies_every_tool_call(fake_llm: Any, session: Session) -> None:
    """Revoked mid-turn, before the cancel lands: the call is denied, not run."""
    fake_llm.script(Reply(tool_calls=[("clock.now", {})]), Reply(text="done"))
    services.run_turn(session.id, "time?")
    log.append(session.id, "session/revoked", {"by": "ops", "reason": "now"})
    assert drive(session.id) == "ended"
    (result,) = events(session, "tool/result")
    assert result == {**result, "is_error": True, "content": "denied: the session is revoked"}


@pytest.mark.usefixtures("manual_worker")
def test_abandon_closes_a_blocked_turn_failed_with_owed_results(session: Session) -> None:
    services.run_turn(session.id, "go")
    for kind, data in [
        ("step/start", {"step": 1, "model": "test/model"}),
        ("assistant/message", {"content": None, "tool_calls": [{"id": "c1", "name": "clock.now", "arguments": "{}"}]}),
        ("turn/blocked", {"reason": "provider down", "attempts": 5}),
    ]:
        log.append(session.id, kind, data)
    with pytest.raises(InvalidInput):
        operators.abandon(session.id, by="ops", reason="x" * 501)
    operators.abandon(session.id, by="ops", reason="gave up")
    (result,) = events(session, "tool/result")
    assert result["call_id"] == "c1" and result["is_error"] is True
    (end,) = events(session, "turn/end")
    assert end == {"status": "failed", "error": "abandoned by ops: gave up", "by": "ops"}
    with pytest.raises(NotAbandonable):
        operators.abandon(session.id, by="ops")
    assert OperatorAction.objects.filter(action="abandon", actor="ops", reason="gave up").count() == 1


@pytest.mark.usefixtures("manual_worker")
def test_abandon_after_the_lease_lapsed_fences_out_its_holder(session: Session) -> None:
    """A holder whose lease lapsed may still be running: once an operator has
    closed its turn, nothing it appends lands (a second turn/end otherwise)."""
    services.run_turn(session.id, "go")
    log.append(session.id, "turn/blocked", {"reason": "provider down", "attempts": 5})
    held = lease.claim(session.id)
    assert held is not None
    Session.objects.filter(id=session.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    operators.abandon(session.id, by="ops", reason="gave up")
    with pytest.raises(LeaseLost):
        log.append(session.id, "turn/end", {"status": "completed"}, fence=held.fence)
    assert [e["status"] for e in events(session, "turn/end")] == ["failed"]
    assert lease.release(held) is None  # superseded: its release changes nothing either


@pytest.mark.usefixtures("manual_worker")
def test_attention_lists_what_needs_a_human(session: Session, owner: Any, profile: AgentProfile) -> None:
    blocked = services.create_session(owner, profile)
    services.run_turn(blocked.id, "go")
    log.append(blocked.id, "turn/blocked", {"reason": "down", "attempts": 5})
    operators.suspend("profile", profile.name, by="ops", reason="r")
    operators.suspend("session", str(session.id), by="ops")
    services.inject(session.id, "held", wake=True)
    found = operators.attention()
    assert [i.session_id for i in found["blocked"]] == [str(blocked.id)]
    assert {i.title for i in found["suspended"]} >= {f"profile {profile.name}"}
    assert str(session.id) in [i.session_id for i in found["suspended"]]
    assert [i.session_id for i in found["held_input"]] == [str(session.id)]
    assert found["blocked"][0].as_json()["age_seconds"] is not None
    limits.forget_suspensions()
