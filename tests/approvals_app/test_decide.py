"""decide(): one verdict per call, and every refusal appends nothing."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import connection

from approvals_app import services as approvals
from approvals_app.selectors import pending
from sessions_app import log
from sessions_app.errors import (
    AlreadyDecided,
    InvalidInput,
    NotAllowed,
    TerretError,
    TurnClosed,
    UnknownCall,
    UnknownSession,
)
from sessions_app.models import Session
from tests.approvals_app.conftest import count, events, park

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


def test_verdict_appends_resolved_with_who_and_why(session: Session, reviewer: Any) -> None:
    seq = park(session.id)
    event = approvals.decide(session.id, "c1", "deny", user=reviewer, reason="  too risky  ", request_seq=seq)
    assert (event.kind, event.data) == (
        "approval/resolved",
        {
            "call_id": "c1",
            "verdict": "deny",
            "reason": "too risky",
            "by": "rev",
            # What the reviewer's authority rested on, and the policy in force (none yet).
            "grounds": {"as": "reviewers", "group": "reviewers", "user_id": reviewer.pk, "policy_seq": None},
        },
    )
    assert pending(session.id) == []
    session.refresh_from_db()
    assert session.pending_approvals == 0


def test_errors_carry_codes_and_statuses() -> None:
    for cls, code, status in [
        (AlreadyDecided, "already_decided", 409),
        (UnknownCall, "unknown_call", 404),
        (TurnClosed, "turn_closed", 409),
        (NotAllowed, "not_allowed", 403),
        (UnknownSession, "unknown_session", 404),
    ]:
        assert issubclass(cls, TerretError) and (cls.code, cls.status) == (code, status)


def test_second_verdict_is_already_decided_and_appends_nothing(session: Session, make_reviewer: Any) -> None:
    park(session.id)
    approvals.decide(session.id, "c1", "approve", user=make_reviewer("first"))
    before = count(session)
    with pytest.raises(AlreadyDecided, match=r"already decided \(approve by first\)"):
        approvals.decide(session.id, "c1", "deny", user=make_reviewer("second"))
    assert count(session) == before


def test_unknown_call_id(session: Session, reviewer: Any) -> None:
    park(session.id)
    before = count(session)
    with pytest.raises(UnknownCall):
        approvals.decide(session.id, "nope", "approve", user=reviewer)
    with pytest.raises(UnknownCall):  # right id, wrong request
        approvals.decide(session.id, "c1", "approve", user=reviewer, request_seq=1)
    assert count(session) == before


def test_call_of_a_closed_turn(session: Session, reviewer: Any) -> None:
    seq = park(session.id)
    log.append(session.id, "turn/end", {"status": "failed", "error": "x"})
    before = count(session)
    with pytest.raises(TurnClosed):
        approvals.decide(session.id, "c1", "approve", user=reviewer)
    # ... and with a newer turn open, the old request is still closed.
    log.append(session.id, "turn/start", {})
    with pytest.raises(TurnClosed):
        approvals.decide(session.id, "c1", "approve", user=reviewer, request_seq=seq)
    with pytest.raises(TurnClosed):
        approvals.decide(session.id, "c1", "approve", user=reviewer)
    with pytest.raises(UnknownCall):  # never asked anywhere
        approvals.decide(session.id, "c9", "approve", user=reviewer)
    assert count(session) == before + 1  # only the turn/start above


def test_unknown_session(reviewer: Any) -> None:
    with pytest.raises(UnknownSession):
        approvals.decide("00000000-0000-0000-0000-000000000000", "c1", "approve", user=reviewer)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"verdict": "maybe"}, "verdict"),
        ({"call_id": ""}, "call id"),
        ({"call_id": "x" * 201}, "call id"),
        ({"reason": "x" * 2001}, "reason"),
        ({"reason": 5}, "reason"),
        ({"request_seq": "abc"}, "seq"),
        ({"request_seq": 0}, "seq"),
        ({"session_id": "not-a-uuid"}, "UUID"),
    ],
)
def test_bad_input_is_refused_and_appends_nothing(
    session: Session, reviewer: Any, kwargs: dict[str, Any], message: str
) -> None:
    park(session.id)
    before = count(session)
    args = {"session_id": session.id, "call_id": "c1", "verdict": "approve"} | kwargs
    session_id, call_id, verdict = args.pop("session_id"), args.pop("call_id"), args.pop("verdict")
    with pytest.raises(InvalidInput, match=message):
        approvals.decide(session_id, call_id, verdict, user=reviewer, **args)
    assert count(session) == before


def test_who_may_decide(session: Session, make_user: Any, make_reviewer: Any, django_user_model: Any) -> None:
    park(session.id)
    before = count(session)
    owner = session.owner
    staff = make_user("staff", is_staff=True)  # sees every session, but may not approve
    inactive = make_reviewer("gone", is_active=False)
    for user in [AnonymousUser(), owner, make_user("other"), staff, inactive]:
        with pytest.raises(NotAllowed):
            approvals.decide(session.id, "c1", "approve", user=user)
    assert count(session) == before
    admin = django_user_model.objects.create_superuser("admin", password="pw")
    assert approvals.decide(session.id, "c1", "approve", user=admin).data["by"] == "admin"


def test_decide_wakes_a_worker_on_commit(session: Session, reviewer: Any, settings: Any, monkeypatch: Any) -> None:
    from sessions_app.runtime import dispatch

    woken: list[str] = []
    monkeypatch.setattr(dispatch, "wake", lambda sid: woken.append(str(sid)))
    park(session.id)
    approvals.decide(session.id, "c1", "approve", user=reviewer)
    with pytest.raises(AlreadyDecided):
        approvals.decide(session.id, "c1", "approve", user=reviewer)
    assert woken == [str(session.id)]  # once: the refused verdict wakes nobody


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_reviewers_at_once_one_verdict_lands(session: Session, make_reviewer: Any) -> None:
    """Real concurrent transactions on Postgres: both reviewers pass every
    check outside the lock at the same moment; the row lock lets one in."""
    park(session.id)
    reviewers = [make_reviewer(f"r{i}") for i in range(2)]
    before = count(session)
    for attempt in range(5):  # several rounds, a fresh call each time
        call_id = f"race{attempt}"
        park(session.id, call_id, new_turn=False)
        barrier = threading.Barrier(2)
        outcomes: list[str] = []
        lock = threading.Lock()

        def click(user: Any, verdict: str) -> None:
            try:
                barrier.wait(5)
                approvals.decide(session.id, call_id, verdict, user=user)
                result = "landed"
            except AlreadyDecided:
                result = "already"
            finally:
                connection.close()
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=click, args=(u, v)) for u, v in zip(reviewers, ["approve", "deny"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(outcomes) == ["already", "landed"], outcomes
        resolved = [e for e in events(session, "approval/resolved") if e["call_id"] == call_id]
        assert len(resolved) == 1
    # Each round added its assistant message + request + exactly one verdict.
    assert count(session) == before + 5 * 3
