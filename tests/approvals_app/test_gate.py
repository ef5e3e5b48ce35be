"""The gate and the selectors it reads, on hand-built turns: what counts as
a verdict for which call."""

from __future__ import annotations

from typing import Any

import pytest

from approvals_app import gate
from approvals_app.selectors import approval_records, pending_from_events, verdict_in_turn
from sessions_app.log.reads import LoggedEvent
from sessions_app.permissions import grounds_of
from sessions_app.tools.builtins import BUILTINS

WRITE = BUILTINS["workspace.write"]  # approval=policy, mutating
READ = BUILTINS["workspace.read"]  # approval=never, not mutating
NOOP = BUILTINS["debug.noop"]
A = {"path": "a.txt", "content": "x"}
B = {"path": "b.txt", "content": "x"}


def req(seq: int, call_id: str, args: dict[str, Any], name: str = "workspace.write") -> LoggedEvent:
    return LoggedEvent(seq, "approval/requested", {"call_id": call_id, "name": name, "args": args})


def res(seq: int, call_id: str, verdict: str, reason: str = "", *, by: Any = None) -> LoggedEvent:
    """A verdict; `by` (a user) makes it a reviewer's, with the grounds decide() records."""
    data: dict[str, Any] = {"call_id": call_id, "verdict": verdict}
    if reason:
        data["reason"] = reason
    if by is not None:
        data["by"] = by.get_username()
        data["grounds"] = {**grounds_of(by), "policy_seq": None}
    return LoggedEvent(seq, "approval/resolved", data)


def test_modes() -> None:
    assert gate.needs_approval(WRITE, {}) is True  # policy + mutating asks
    assert gate.needs_approval(READ, {}) is False  # never
    assert gate.needs_approval(NOOP, {"debug.noop": "always"}) is True
    assert gate.needs_approval(WRITE, {"workspace.write": "never"}) is False
    assert gate.needs_approval(READ, {"workspace.read": "policy"}) is False  # policy, but not mutating
    assert gate.needs_approval(READ, {"workspace.read": "bogus"}) is True  # unreadable override: ask


@pytest.mark.django_db
def test_ask_then_park_then_verdict(reviewer: Any) -> None:
    assert gate.check([], WRITE, {}, "c1", A).action == "ask"
    assert gate.check([req(5, "c1", A)], WRITE, {}, "c1", A).action == "park"
    assert gate.check([req(5, "c1", A), res(6, "c1", "approve", by=reviewer)], WRITE, {}, "c1", A).action == "run"
    denied = gate.check([req(5, "c1", A), res(6, "c1", "deny", "no")], WRITE, {}, "c1", A)
    assert (denied.action, denied.reason) == ("deny", "no")
    assert gate.check([req(5, "c1", A), res(6, "c1", "deny")], WRITE, {}, "c1", A).reason == "denied by reviewer"
    assert gate.check([], READ, {}, "c1", A).action == "run"


@pytest.mark.django_db
def test_verdict_is_bound_to_tool_and_arguments(reviewer: Any) -> None:
    events = [req(5, "c1", A), res(6, "c1", "approve", by=reviewer)]
    assert gate.check(events, WRITE, {}, "c1", B).action == "ask"  # other arguments: asked again
    assert gate.check(events, WRITE, {}, "c2", A).action == "ask"  # other call id
    noop_always = {"debug.noop": "always"}
    assert gate.check(events, NOOP, noop_always, "c1", A).action == "ask"  # other tool
    # Argument order does not matter; values do.
    assert gate.check(events, WRITE, {}, "c1", {"content": "x", "path": "a.txt"}).action == "run"


@pytest.mark.django_db
def test_verdict_for_an_earlier_call_reusing_the_id_does_not_count(reviewer: Any) -> None:
    events = [req(5, "c1", A), res(6, "c1", "approve", by=reviewer)]
    # The same id and arguments in a later step's message (seq 9) is a new call.
    assert gate.check(events, WRITE, {}, "c1", A, after_seq=9).action == "ask"
    assert gate.check(events, WRITE, {}, "c1", A, after_seq=4).action == "run"


def test_resolution_settles_the_latest_unsettled_request_only() -> None:
    # c1 asked for A and settled; asked again for B: the old verdict is not B's.
    events = [req(5, "c1", A), res(6, "c1", "approve"), req(9, "c1", B)]
    assert verdict_in_turn(events, "c1", "workspace.write", B) is None
    assert [p.seq for p in pending_from_events(events)] == [9]
    events.append(res(10, "c1", "deny", "nope"))
    assert verdict_in_turn(events, "c1", "workspace.write", B).verdict == "deny"  # type: ignore[union-attr]
    assert verdict_in_turn(events, "c1", "workspace.write", A).verdict == "approve"  # type: ignore[union-attr]
    assert pending_from_events(events) == []


def test_stray_resolution_and_superseded_request() -> None:
    events = [res(3, "zz", "approve"), req(5, "c1", A), req(7, "c1", B)]
    records = approval_records(events)
    assert [(r.seq, r.superseded, r.verdict) for r in records] == [(5, True, None), (7, False, None)]
    assert [p.seq for p in pending_from_events(events)] == [7]


def test_a_repeated_call_id_waits_behind_the_unsettled_request() -> None:
    # One message carrying c1 twice (a provider bug): the second must not
    # supersede the first, or pending_approvals would count a request nobody
    # can ever decide.
    assert gate.check([req(5, "c1", A)], WRITE, {}, "c1", B, after_seq=4).action == "park"
    assert gate.check([req(5, "c1", A), res(6, "c1", "approve")], WRITE, {}, "c1", B, after_seq=4).action == "ask"


# --- an approval carries its authority: checked again before the call runs


def voided(decision: gate.GateDecision) -> str | None:
    return decision.voided["reason"] if decision.action == "ask" and decision.voided else None


@pytest.mark.django_db
def test_an_approval_is_void_once_its_reviewer_is_deactivated(reviewer: Any) -> None:
    events = [req(5, "c1", A), res(6, "c1", "approve", by=reviewer)]
    assert gate.check(events, WRITE, {}, "c1", A).action == "run"
    reviewer.is_active = False
    reviewer.save()
    decision = gate.check(events, WRITE, {}, "c1", A)
    assert decision.action == "ask" and decision.voided == {
        "call_id": "c1",
        "request_seq": 5,
        "verdict_seq": 6,
        "reason": "reviewer_inactive",
        "by": "rev",
    }


@pytest.mark.django_db
def test_an_approval_is_void_once_its_reviewer_leaves_the_group(reviewer: Any) -> None:
    events = [req(5, "c1", A), res(6, "c1", "approve", by=reviewer)]
    assert events[1].data["grounds"]["as"] == "reviewers" and events[1].data["grounds"]["group"] == "reviewers"
    reviewer.groups.clear()
    assert voided(gate.check(events, WRITE, {}, "c1", A)) == "reviewer_left_group"
    reviewer.delete()
    assert voided(gate.check(events, WRITE, {}, "c1", A)) == "reviewer_deleted"


@pytest.mark.django_db
def test_staff_grounds_hold_while_staff(make_user: Any, make_reviewer: Any) -> None:
    boss = make_user("boss", is_staff=True, is_superuser=True)
    events = [req(5, "c1", A), res(6, "c1", "approve", by=boss)]
    assert events[1].data["grounds"]["as"] == "staff"
    assert gate.check(events, WRITE, {}, "c1", A).action == "run"
    boss.is_superuser = boss.is_staff = False
    boss.save()
    assert voided(gate.check(events, WRITE, {}, "c1", A)) == "reviewer_not_staff"
    # A staff reviewer who is in the group too stands on the group.
    both = make_reviewer("both", is_staff=True)
    assert grounds_of(both)["as"] == "reviewers"


@pytest.mark.django_db
def test_a_revocation_after_the_approval_voids_it(reviewer: Any) -> None:
    events = [req(5, "c1", A), res(6, "c1", "approve", by=reviewer)]
    revoked = [
        *events,
        LoggedEvent(7, "session/revoked", {"by": "op"}),
        LoggedEvent(8, "session/restored", {"by": "op"}),
    ]
    assert voided(gate.check(revoked, WRITE, {}, "c1", A)) == "session_revoked"
    # Revoked and restored before the verdict: the verdict stands.
    earlier = [req(5, "c1", A), LoggedEvent(6, "session/revoked", {"by": "op"}), res(7, "c1", "approve", by=reviewer)]
    assert gate.check(earlier, WRITE, {}, "c1", A).action == "run"


@pytest.mark.django_db
def test_an_approval_without_a_known_reviewer_is_void() -> None:
    assert voided(gate.check([req(5, "c1", A), res(6, "c1", "approve")], WRITE, {}, "c1", A)) == "reviewer_deleted"


@pytest.mark.django_db
def test_a_started_call_is_the_ledger_s_not_voided_again(reviewer: Any) -> None:
    """Once the call's first attempt is committed the grant was used: a
    retry after a crash is no new grant, so it is not checked again."""
    attempt = LoggedEvent(7, "tool/attempt", {"call_id": "c1", "name": "workspace.write", "attempt": 1})
    events = [req(5, "c1", A), res(6, "c1", "approve", by=reviewer), attempt]
    reviewer.is_active = False
    reviewer.save()
    assert gate.check(events, WRITE, {}, "c1", A).action == "run"


@pytest.mark.django_db
def test_after_a_void_the_new_request_waits(reviewer: Any) -> None:
    void = LoggedEvent(7, "approval/voided", {"call_id": "c1", "request_seq": 5, "verdict_seq": 6, "reason": "x"})
    events = [req(5, "c1", A), res(6, "c1", "approve", by=reviewer), void, req(8, "c1", A)]
    reviewer.is_active = False
    reviewer.save()
    assert gate.check(events, WRITE, {}, "c1", A).action == "park"
    records = approval_records(events)
    assert [(r.seq, r.voided, r.open) for r in records] == [(5, "x", False), (8, None, True)]
