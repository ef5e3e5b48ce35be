"""Approval deadlines, opt-in (issue 31, Build 2): the clock's decisions,
the settings they come from, the events it appends, and a verdict after
expiry refused on every door."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from approvals_app import deadlines, gate
from approvals_app import services as approvals
from approvals_app.selectors import ApprovalRecord, Verdict, approval_records, pending
from sessions_app import services
from sessions_app.errors import ApprovalExpired
from sessions_app.log.reads import events_since
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.drive import drive
from sessions_app.runtime.profiles import check_profile
from sessions_app.tools.builtins import BUILTINS
from tests.approvals_app.conftest import count, events, kinds, park
from tests.fakes.fake_llm import Reply
from tests.helpers import client_for, wait_for

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.UTC)
WRITE_A = ("workspace.write", {"path": "a.txt", "content": "hello"})
EXPIRED_TEXT = "the request for approval expired: no verdict within 5 s"


def record(clock: dict[str, Any] | None, **kw: Any) -> ApprovalRecord:
    return ApprovalRecord(7, "c1", "workspace.write", {}, deadline=clock, **kw)


def clock(deadline: int | None = 5, *, remind: int | None = None, on_expiry: str = "deny", to: str | None = None):
    return {"deadline_s": deadline, "remind_every_s": remind, "escalate_to": to, "on_expiry": on_expiry}


def after(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- the clock's decisions (pure)


def test_no_clock_no_moves() -> None:
    assert deadlines.due(record(None), T0, after(10**6)) == []


def test_deny_expiry_at_the_deadline_and_not_before() -> None:
    assert deadlines.due(record(clock(5)), T0, after(4.9)) == []
    assert deadlines.due(record(clock(5)), T0, after(5)) == [
        ("approval/expired", {"call_id": "c1", "request_seq": 7, "deadline_s": 5, "on_expiry": "deny"})
    ]


def test_a_settled_request_has_no_clock() -> None:
    decided = record(clock(5, remind=1), verdict=Verdict("approve", "", "rev", 8))
    assert deadlines.due(decided, T0, after(60)) == []
    superseded = record(clock(5), superseded=True)
    assert deadlines.due(superseded, T0, after(60)) == []


def test_park_expiry_escalates_once_and_keeps_reminding() -> None:
    moves = deadlines.due(record(clock(5, remind=2, on_expiry="park", to="ops")), T0, after(5.2))
    assert moves == [
        ("approval/expired", {"call_id": "c1", "request_seq": 7, "deadline_s": 5, "on_expiry": "park"}),
        ("approval/escalated", {"call_id": "c1", "request_seq": 7, "to": "ops", "waited_s": 5.2}),
        ("approval/reminded", {"call_id": "c1", "request_seq": 7, "n": 2, "waited_s": 5.2}),
    ]
    later = record(clock(5, remind=2, on_expiry="park"), expired=True, escalated=True, reminded=2)
    assert deadlines.due(later, T0, after(5.9)) == []
    assert [k for k, _ in deadlines.due(later, T0, after(6))] == ["approval/reminded"]


def test_a_deny_expiry_stops_the_reminders() -> None:
    assert [k for k, _ in deadlines.due(record(clock(5, remind=1)), T0, after(9))] == ["approval/expired"]


def test_reminders_once_per_interval_and_no_burst_after_downtime() -> None:
    plain = clock(None, remind=60)
    assert deadlines.due(record(plain), T0, after(59)) == []
    assert deadlines.due(record(plain), T0, after(61)) == [
        ("approval/reminded", {"call_id": "c1", "request_seq": 7, "n": 1, "waited_s": 61.0})
    ]
    assert deadlines.due(record(plain, reminded=1), T0, after(119)) == []
    # Down for ten intervals: one reminder, counting them all.
    assert [d["n"] for _, d in deadlines.due(record(plain, reminded=1), T0, after(660))] == [11]


def test_next_due_is_the_deadline_or_the_next_reminder() -> None:
    assert deadlines.next_due(record(None), T0) is None
    assert deadlines.next_due(record(clock(5, remind=2)), T0) == after(2)
    assert deadlines.next_due(record(clock(5, remind=2), reminded=2), T0) == after(5)
    assert deadlines.next_due(record(clock(5, remind=2, on_expiry="park"), reminded=2, expired=True), T0) == after(6)
    assert deadlines.next_due(record(clock(5, on_expiry="park"), expired=True, escalated=True), T0) is None
    assert deadlines.next_due(record(clock(5), verdict=Verdict("deny", "", "rev", 8)), T0) is None


# --- where a clock comes from


def test_no_deadline_by_default(profile: AgentProfile) -> None:
    assert gate.deadline_for(profile, {}, "workspace.write") is None
    assert gate.deadline_for(None, {}, "workspace.write") is None


def test_profile_and_tool_settings(profile: AgentProfile) -> None:
    ops = Group.objects.create(name="ops")
    profile.approval_deadline_s, profile.on_expiry, profile.escalate_to = 600, "park", ops
    profile.save()
    assert gate.deadline_for(profile, {}, "workspace.write") == clock(600, on_expiry="park", to="ops")
    # A tool's own settings override the profile's, key by key.
    own = {"workspace.write": {"mode": "always", "approval_deadline_s": 5, "on_expiry": "deny"}}
    assert gate.deadline_for(profile, own, "workspace.write") == clock(5, to="ops")
    assert gate.deadline_for(profile, own, "clock.now") == clock(600, on_expiry="park", to="ops")
    assert gate.needs_approval(BUILTINS["clock.now"], {"clock.now": {"mode": "always"}})
    assert not gate.needs_approval(BUILTINS["workspace.write"], {"workspace.write": {"mode": "never"}})
    # A tool may turn the profile's deadline off, and keep reminders.
    assert gate.deadline_for(
        profile, {"clock.now": {"approval_deadline_s": None, "remind_every_s": 30}}, "clock.now"
    ) == (clock(None, remind=30, on_expiry="park", to="ops"))


def test_profile_checks_a_tool_s_approval_settings(profile: AgentProfile) -> None:
    Group.objects.create(name="ops")
    fine = {"workspace.write": {"mode": "always", "approval_deadline_s": 5, "escalate_to": "ops", "on_expiry": "park"}}
    assert check_profile(roles={}, builtin_tools=["workspace.write"], mcp_servers=[], approvals=fine) == {}
    bad = {
        "workspace.write": {
            "mode": "sometimes",
            "approval_deadline_s": 0,
            "remind_every_s": "1m",
            "on_expiry": "approve",
            "escalate_to": "nobody",
            "deadline": 5,
        }
    }
    problems = check_profile(roles={}, builtin_tools=["workspace.write"], mcp_servers=[], approvals=bad)["approvals"]
    assert problems == [
        "workspace.write: unknown key(s) deadline; the keys are mode, approval_deadline_s, remind_every_s, "
        "escalate_to, on_expiry",
        "workspace.write: 'sometimes' is not an approval mode; use one of never, policy, always",
        "workspace.write: approval_deadline_s must be a whole number of seconds, at least 1 (or null: none)",
        "workspace.write: remind_every_s must be a whole number of seconds, at least 1 (or null: none)",
        "workspace.write: on_expiry must be deny or park",
        "workspace.write: escalate_to must name a group (or be null)",
    ]


# --- the clock against the log (both databases)


def requested_at(session: Session, seq: int) -> datetime:
    return Event.objects.get(session=session, seq=seq).created_at


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
class TestClock:
    def test_expiry_with_deny_settles_once_and_refuses_a_late_verdict(self, session: Session, reviewer: Any) -> None:
        seq = park(session.id, deadline=clock(5))
        at = requested_at(session, seq)
        assert deadlines.tick(at + timedelta(seconds=4)) == 0
        assert deadlines.tick(at + timedelta(seconds=5)) == 1
        assert deadlines.tick(at + timedelta(seconds=9)) == 0  # once, however many ticks
        assert events(session, "approval/expired") == [
            {"call_id": "c1", "request_seq": seq, "deadline_s": 5, "on_expiry": "deny"}
        ]
        assert events(session, "approval/resolved") == []  # no human's denial
        session.refresh_from_db()
        assert session.pending_approvals == 0 and pending(session.id) == []
        [settled] = approval_records(events_since(session.id, 0))
        assert settled.verdict is not None and settled.verdict.expired and settled.verdict.reason == EXPIRED_TEXT

        before = count(session)
        with pytest.raises(ApprovalExpired):
            approvals.decide(session.id, "c1", "approve", user=reviewer)
        # The API door: 409 approval_expired, nothing appended.
        answer = client_for(reviewer).post(
            f"/api/sessions/{session.id}/approvals/c1", {"verdict": "approve"}, content_type="application/json"
        )
        assert answer.status_code == 409 and answer.json()["code"] == "approval_expired", answer.content
        assert count(session) == before

    def test_expiry_with_park_escalates_and_a_verdict_still_lands(self, session: Session, reviewer: Any) -> None:
        seq = park(session.id, deadline=clock(5, on_expiry="park", to="ops"))
        at = requested_at(session, seq)
        assert deadlines.tick(at + timedelta(seconds=6)) == 2
        assert kinds(session, seq) == ["approval/expired", "approval/escalated"]
        assert events(session, "approval/escalated") == [
            {"call_id": "c1", "request_seq": seq, "to": "ops", "waited_s": 6.0}
        ]
        assert deadlines.tick(at + timedelta(seconds=600)) == 0  # escalated once
        session.refresh_from_db()
        assert session.pending_approvals == 1 and [p.seq for p in pending(session.id)] == [seq]
        approvals.decide(session.id, "c1", "approve", user=reviewer)
        assert pending(session.id) == []

    def test_a_session_is_read_again_when_due_or_when_it_moved(self, session: Session, reviewer: Any) -> None:
        seq = park(session.id, deadline=clock(60))
        at = requested_at(session, seq)
        assert deadlines.tick(at + timedelta(seconds=1)) == 0
        assert deadlines._next[session.id][1] == at + timedelta(seconds=60)  # not read again before then
        # A new request with a shorter clock moves the head: read again at once.
        park(session.id, "c2", deadline=clock(2), new_turn=False)
        assert deadlines.tick(at + timedelta(seconds=3)) == 1
        assert [e["call_id"] for e in events(session, "approval/expired")] == ["c2"]

    def test_a_quick_tick_looks_at_profiles_with_a_clock_a_full_one_at_all(
        self, session: Session, profile: AgentProfile
    ) -> None:
        seq = park(session.id, deadline=clock(5))  # asked on a clock its profile no longer sets
        at = requested_at(session, seq) + timedelta(seconds=5)
        assert deadlines.clocked_profiles() == []
        assert deadlines.tick(at, full=False) == 0
        profile.approvals = {"workspace.write": {"mode": "always", "remind_every_s": 60}}
        profile.save()
        assert deadlines.clocked_profiles() == [profile.pk]
        assert deadlines.tick(at, full=False) == 1
        assert kinds(session, seq) == ["approval/expired"]

    def test_no_clock_no_events(self, session: Session) -> None:
        seq = park(session.id)
        assert deadlines.tick(requested_at(session, seq) + timedelta(days=365)) == 0
        assert kinds(session, seq) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
def test_the_loop_asks_with_the_clock_and_goes_on_with_the_expiry(
    fake_llm: Any, session: Session, profile: AgentProfile, reviewer: Any, tmp_path: Path
) -> None:
    profile.approval_deadline_s = 5
    profile.save()
    fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="it expired"))
    services.run_turn(session.id, "write it")
    assert drive(session.id) == "parked"
    [call] = pending(session.id)
    [asked] = events(session, "approval/requested")
    assert asked["deadline"] == clock(5)
    deadlines.tick(requested_at(session, call.seq) + timedelta(seconds=5))
    assert drive(session.id) == "ended"
    [result] = events(session, "tool/result")
    assert result["is_error"] is True and result["content"] == f"denied: {EXPIRED_TEXT}"
    assert fake_llm.requests[1]["messages"][-1]["content"] == f"denied: {EXPIRED_TEXT}"
    assert not (tmp_path / session.id.hex / "a.txt").exists()
    page = client_for(session.owner).get(f"/sessions/{session.id}/").content.decode()
    assert "No verdict within 5 s: the request expired and the call was not run" in page
    with pytest.raises(ApprovalExpired):  # the turn has ended: still told why, not just "turn closed"
        approvals.decide(session.id, call.call_id, "approve", user=reviewer)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_deadline_expires_under_real_workers(
    start_worker: Any, fake_llm: Any, make_user: Any, make_reviewer: Any, settings: Any, tmp_path: Path
) -> None:
    """Done when: with approval_deadline_s=5, on_expiry=deny, approval/expired
    lands at about 5 s (the worker's clock thread), the turn goes on with the
    denial, and a late verdict gets 409 approval_expired."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path  # the workers inherit it
    profile = AgentProfile.objects.create(
        name="w",
        roles={"main": "test/model"},
        builtin_tools=["workspace.write"],
        allow_floor=["workspace.*"],
        approval_deadline_s=5,
        on_expiry="deny",
    )
    fake_llm.script(Reply(tool_calls=[WRITE_A]), Reply(text="it expired"))
    session = services.create_session(make_user("owner"), profile)
    start_worker(name="w")
    services.run_turn(session.id, "write the file")
    [call] = wait_for(lambda: pending(session.id), 60, "the call to park")

    wait_for(lambda: events(session, "turn/end"), 30, "the expiry and the turn's end")
    asked_at = requested_at(session, call.seq)
    expired = Event.objects.get(session=session, kind="approval/expired")
    late = (expired.created_at - asked_at).total_seconds()
    assert 5.0 <= late < 8.0, late  # each worker reads the clocks about once a second
    assert expired.data == {"call_id": call.call_id, "request_seq": call.seq, "deadline_s": 5, "on_expiry": "deny"}
    assert events(session, "turn/end") == [{"status": "completed"}]
    [result] = events(session, "tool/result")
    assert result["is_error"] is True and result["content"] == f"denied: {EXPIRED_TEXT}"
    assert events(session, "approval/resolved") == []  # never recorded as a human's denial
    assert events(session, "tool/attempt") == [] and not (tmp_path / session.id.hex / "a.txt").exists()

    reviewer = make_reviewer("rev")
    before = count(session)
    answer = client_for(reviewer).post(
        f"/api/sessions/{session.id}/approvals/{call.call_id}",
        {"verdict": "approve", "request_seq": call.seq},
        content_type="application/json",
    )
    assert answer.status_code == 409 and answer.json()["code"] == "approval_expired", answer.content
    assert count(session) == before
