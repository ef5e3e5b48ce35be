"""Approve with edits, and "allow this tool for this session", through the
real turn loop (TERRET_WORKER=manual, FakeLLM at the HTTP boundary). What
ran is counted at the tool: the file workspace.write wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from approvals_app import services as approvals
from approvals_app.selectors import pending
from policies_app import services as policies
from sessions_app import services
from sessions_app.errors import AlreadyDecided, InvalidInput, NotAllowed
from sessions_app.models import Event, Session
from sessions_app.runtime import documents, effects
from sessions_app.runtime.drive import drive
from tests.approvals_app.conftest import count, events, kinds, park
from tests.fakes.fake_llm import Reply
from tests.helpers import document_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

WRITE = ("workspace.write", {"path": "a.txt", "content": "from the model"})
EDITED = {"path": "a.txt", "content": "from the reviewer"}


def parked_call(fake_llm: Any, session: Session, *replies: Reply) -> Any:
    fake_llm.script(Reply(tool_calls=[WRITE]), *replies)
    services.run_turn(session.id, "write it")
    assert drive(session.id) == "parked"
    [call] = pending(session.id)
    return call


def test_the_tool_runs_with_the_edited_arguments_and_the_model_is_told(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    call = parked_call(fake_llm, session, Reply(text="written"))
    verdict = approvals.decide(
        session.id, call.call_id, "approve", user=reviewer, request_seq=call.seq, edited_args=EDITED
    )
    assert verdict.data == {
        "call_id": call.call_id,
        "verdict": "approve",
        "edited_args": EDITED,
        "by": "rev",
        "grounds": {"as": "reviewers", "group": "reviewers", "user_id": reviewer.pk, "policy_seq": None},
    }
    assert drive(session.id) == "ended"
    # At the tool: the reviewer's text was written, never the model's.
    assert document_text(session.id, "a.txt") == "from the reviewer"
    [attempt] = events(session, "tool/attempt")
    assert json.loads(attempt["arguments"]) == EDITED and attempt["edited"] is True
    [result] = events(session, "tool/result")
    assert result["is_error"] is False
    assert result["content"].startswith("(A reviewer edited the arguments before approving; the tool ran with ")
    # The model saw that note with the result.
    tool_message = fake_llm.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "A reviewer edited the arguments" in tool_message["content"]
    # The effect ledger names the arguments that ran.
    [effect] = effects.effects(session.id)
    assert json.loads(effect.arguments) == EDITED
    assert [e.arguments for e in effects.call_effects(session.id, call.call_id)] == [effect.arguments]


def test_a_replayed_attempt_runs_the_edited_arguments_again(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    """The edit lives in the log: a fresh drive (a restarted worker) runs it."""
    call = parked_call(fake_llm, session, Reply(text="written"))
    approvals.decide(session.id, call.call_id, "approve", user=reviewer, edited_args=EDITED)
    # Nothing in this process remembers the edit: the next drive reads it from the verdict.
    assert drive(session.id) == "ended"
    assert document_text(session.id, "a.txt") == "from the reviewer"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"path": "a.txt"}, "do not fit workspace.write's parameters"),
        ({"path": "a.txt", "content": 5}, "do not fit workspace.write's parameters"),
        ({"path": "a.txt", "content": "x", "extra": 1}, "do not fit workspace.write's parameters"),
        (["not", "an", "object"], "must be a JSON object"),
        ({"content": "x" * 60_000, "path": "a.txt"}, "longer than"),
    ],
)
def test_an_edit_that_does_not_validate_is_refused_and_changes_nothing(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path, edit: Any, message: str
) -> None:
    call = parked_call(fake_llm, session)
    before = count(session)
    with pytest.raises(InvalidInput, match=message):
        approvals.decide(session.id, call.call_id, "approve", user=reviewer, edited_args=edit)
    assert count(session) == before and [c.call_id for c in pending(session.id)] == [call.call_id]


def test_edits_and_allowing_go_with_an_approval_only(fake_llm: Any, session: Session, reviewer: Any) -> None:
    call = parked_call(fake_llm, session)
    before = count(session)
    with pytest.raises(InvalidInput, match="not a denial"):
        approvals.decide(session.id, call.call_id, "deny", user=reviewer, edited_args=EDITED)
    with pytest.raises(InvalidInput, match="not a denial"):
        approvals.decide(session.id, call.call_id, "deny", user=reviewer, allow_for_session=True)
    assert count(session) == before


def test_an_edit_equal_to_the_models_arguments_is_no_edit(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    call = parked_call(fake_llm, session, Reply(text="ok"))
    same = {"content": "from the model", "path": "a.txt"}  # other key order
    verdict = approvals.decide(session.id, call.call_id, "approve", user=reviewer, edited_args=same)
    assert "edited_args" not in verdict.data
    assert drive(session.id) == "ended"
    [result] = events(session, "tool/result")
    assert "edited" not in result["content"]
    assert "arguments" not in events(session, "tool/attempt")[0]


def test_an_edit_checked_against_one_request_does_not_decide_a_newer_one(session: Session, reviewer: Any) -> None:
    """The edit is validated against the request the reviewer looked at; if
    the call id was asked again meanwhile, the verdict is refused."""
    first = park(session.id, "c1", args={"path": "a.txt", "content": "one"})
    park(session.id, "c1", args={"path": "a.txt", "content": "two"}, new_turn=False)
    before = count(session)
    with pytest.raises(AlreadyDecided):
        approvals.decide(session.id, "c1", "approve", user=reviewer, request_seq=first, edited_args=EDITED)
    assert count(session) == before


def test_a_verdict_for_other_arguments_still_does_not_bind(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    """Binding stays exact: the verdict (edited or not) applies to the request
    for the model's call; a later call with the edited arguments as its own
    is a different call and asks again."""
    edited_as_model = ("workspace.write", EDITED)
    call = parked_call(fake_llm, session, Reply(tool_calls=[edited_as_model]), Reply(text="done"))
    approvals.decide(session.id, call.call_id, "approve", user=reviewer, edited_args=EDITED)
    assert drive(session.id) == "parked"  # step 2's call is asked about on its own
    [again] = pending(session.id)
    assert again.args == EDITED and again.seq > call.seq


# ---------------------------------------------------------------- allow for this session


def test_allow_for_session_appends_the_policy_and_the_verdict_together(
    fake_llm: Any, session: Session, reviewer: Any, tmp_path: Path
) -> None:
    call = parked_call(fake_llm, session, Reply(text="one"), Reply(tool_calls=[WRITE]), Reply(text="two"))
    head = Session.objects.get(id=session.id).last_seq
    verdict = approvals.decide(session.id, call.call_id, "approve", user=reviewer, allow_for_session=True)
    rows = list(Event.objects.filter(session=session, seq__gt=head).order_by("seq").values_list("seq", "kind", "data"))
    assert [k for _, k, _ in rows] == ["policy/updated", "approval/resolved"]
    assert rows[1][0] == verdict.seq == rows[0][0] + 1
    policy = rows[0][2]
    assert policy["auto_approve"] == ["workspace.write"] and policy["by"] == "rev"
    assert policy["patterns"]  # the allow-list in force is kept (the profile's floor, now the session's)
    assert drive(session.id) == "ended"
    # The next turn's workspace.write runs without asking: counted at the tool.
    documents.retire(session.id, "a.txt", reason="deleted")
    services.run_turn(session.id, "again")
    assert drive(session.id) == "ended"
    assert document_text(session.id, "a.txt") == "from the model"
    assert len(events(session, "approval/requested")) == 1


def test_the_allow_list_editor_keeps_waivers_and_ask_again_removes_one(
    fake_llm: Any, session: Session, reviewer: Any, owner: Any
) -> None:
    call = parked_call(fake_llm, session, Reply(text="ok"))
    approvals.decide(session.id, call.call_id, "approve", user=reviewer, allow_for_session=True)
    drive(session.id)
    saved = policies.update_policy(session.id, ["workspace.*", "clock.*"], user=owner)
    assert saved.data["auto_approve"] == ["workspace.write"]
    again = policies.ask_again(session.id, "workspace.write", user=owner)
    assert "auto_approve" not in again.data and again.data["patterns"] == ["workspace.*", "clock.*"]
    before = count(session)
    with pytest.raises(InvalidInput, match="already asks"):
        policies.ask_again(session.id, "workspace.write", user=owner)
    assert count(session) == before
    # Asking again is in force at the next call.
    fake_llm.script(Reply(tool_calls=[WRITE]))
    services.run_turn(session.id, "write")
    assert drive(session.id) == "parked"


def test_ask_again_needs_a_driver_or_a_reviewer(session: Session, make_user: Any) -> None:
    with pytest.raises(NotAllowed):
        policies.ask_again(session.id, "workspace.write", user=make_user("mallory"))


def test_allowing_is_refused_with_the_verdict_when_the_call_is_not_waiting(session: Session, reviewer: Any) -> None:
    park(session.id, "c1")
    approvals.decide(session.id, "c1", "approve", user=reviewer)
    before = count(session)
    with pytest.raises(AlreadyDecided):
        approvals.decide(session.id, "c1", "approve", user=reviewer, allow_for_session=True)
    assert count(session) == before
    assert kinds(session).count("policy/updated") == 0
