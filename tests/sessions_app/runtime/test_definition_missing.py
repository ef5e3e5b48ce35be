"""Missing definitions block a turn; they never drop it (runtime/definitions.py).

Per kind, something the turn needs disappears from the running code or the
definition the turn runs under: a built-in tool (its name taken out of the
code's BUILTINS, as a deploy would), the main model role (no provider serves
it: the deployment's TERRET_LLM_BASE_URL emptied), a summarizer the code does
not have, the compactor role. The turn is `blocked` with code
`definition_missing` and `what` naming it, stays open, and completes after
the definition is restored and the turn retried. The model is the local
fake server over HTTP; requests are counted there. A call the model makes
now, to a name its tool list does not have, still gets the ordinary error
result.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from approvals_app import services as approvals
from sessions_app import services
from sessions_app.log.records import LoggedEvent
from sessions_app.models import AgentProfile, Session
from sessions_app.runtime import effects
from sessions_app.runtime.drive import drive
from sessions_app.tools import builtins, registry
from tests.fakes.fake_llm import Reply
from tests.helpers import edit_profile, events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture(autouse=True)
def fresh_registries() -> Any:
    registry.clear_cache()
    yield
    registry.clear_cache()


def blocked_turn(session: Session) -> dict[str, Any]:
    """The session is blocked, its turn open (no turn/end); its latest turn/blocked."""
    row = Session.objects.get(id=session.id)
    assert row.status == "blocked" and row.open_turn_seq is not None
    assert events(session, "turn/end") == []
    return events(session, "turn/blocked")[-1]


def retried(session: Session) -> str:
    services.retry(session.id, by="operator")
    return drive(session.id)


def no_unknown_tool(fake: Any) -> None:
    """No request the model received tells it "unknown tool"."""
    assert "unknown tool" not in json.dumps(fake.requests)


def test_a_built_in_the_code_lost_blocks_the_turn_before_its_step(
    fake_llm: Any, session: Session, profile: AgentProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    noop = builtins.BUILTINS["debug.noop"]
    monkeypatch.delitem(builtins.BUILTINS, "debug.noop")  # a deploy without it
    fake_llm.script(Reply(text="hi"))
    services.run_turn(session.id, "hello")
    assert drive(session.id) == "blocked"
    blocked = blocked_turn(session)
    assert (blocked["code"], blocked["what"]) == ("definition_missing", "tool:debug.noop")
    assert "running code lacks" in blocked["reason"]
    assert fake_llm.requests == [] and events(session, "step/start") == []  # the step never began

    monkeypatch.setitem(builtins.BUILTINS, "debug.noop", noop)  # the code restored
    registry.clear_cache()
    assert retried(session) == "ended"
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert len(fake_llm.requests) == 1


def test_a_parked_call_to_a_built_in_the_code_lost_is_never_told_unknown_tool(
    fake_llm: Any, session: Session, profile: AgentProfile, monkeypatch: pytest.MonkeyPatch, make_reviewer: Any
) -> None:
    edit_profile(profile, approvals={"workspace.write": "always"})
    fake_llm.script(Reply(tool_calls=[("workspace.write", {"path": "a.txt", "content": "x"})]), Reply(text="done"))
    services.run_turn(session.id, "write it")
    assert drive(session.id) == "parked"
    (asked,) = events(session, "approval/requested")
    write = builtins.BUILTINS["workspace.write"]
    monkeypatch.delitem(builtins.BUILTINS, "workspace.write")
    registry.clear_cache()
    approvals.decide(session.id, asked["call_id"], "approve", user=make_reviewer("rev"))
    assert drive(session.id) == "blocked"
    blocked = blocked_turn(session)
    assert (blocked["code"], blocked["what"]) == ("definition_missing", "tool:workspace.write")
    assert events(session, "tool/result") == [] and len(fake_llm.requests) == 1

    monkeypatch.setitem(builtins.BUILTINS, "workspace.write", write)
    registry.clear_cache()
    assert retried(session) == "ended"
    (result,) = events(session, "tool/result")
    assert not result["is_error"] and events(session, "turn/end") == [{"status": "completed"}]
    no_unknown_tool(fake_llm)
    assert effects.effects_audit(session.id).ok


def test_a_call_the_model_makes_now_to_a_name_it_was_not_offered_gets_an_error_result(
    fake_llm: Any, session: Session
) -> None:
    fake_llm.script(Reply(tool_calls=[("debug.invented", {})]), Reply(text="sorry"))
    services.run_turn(session.id, "hello")
    assert drive(session.id) == "ended"
    (result,) = events(session, "tool/result")
    assert result["is_error"] and result["content"] == "unknown tool 'debug.invented'"
    assert events(session, "turn/blocked") == []
    assert events(session, "turn/end") == [{"status": "completed"}]


def test_a_main_role_no_provider_serves_blocks_the_turn_until_it_is_restored(
    fake_llm: Any, session: Session, settings: Any
) -> None:
    served = settings.TERRET_LLM_BASE_URL
    settings.TERRET_LLM_BASE_URL = ""  # the deployment lost its provider
    fake_llm.script(Reply(text="back"))
    services.run_turn(session.id, "hello")
    assert drive(session.id) == "blocked"
    blocked = blocked_turn(session)
    assert (blocked["code"], blocked["what"]) == ("definition_missing", "role:main")
    assert "TERRET_LLM_BASE_URL" in blocked["reason"]

    settings.TERRET_LLM_BASE_URL = served
    assert retried(session) == "ended"
    assert events(session, "turn/end") == [{"status": "completed"}]
    # The refused step spent nothing, and no spend is guessed for it.
    assert [u for u in events(session, "usage/recorded") if u.get("purpose") == "step"] == []


LIMIT = 20_000


@pytest.fixture
def refusing(fake_llm: Any) -> Any:
    """The fake refusing every request over LIMIT characters as too long."""
    fake_llm.responder = lambda body: Reply(text="noted")
    fake_llm.max_context_chars = LIMIT
    return fake_llm


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"summarizer": "gone"}, "summarizer:gone"),
        ({"roles": {"main": "test/model"}}, "role:compactor"),
    ],
    ids=["summarizer", "compactor-role"],
)
def test_a_refused_request_whose_summarizer_is_gone_blocks_the_turn(
    refusing: Any, session: Session, profile: AgentProfile, settings: Any, change: dict[str, Any], what: str
) -> None:
    settings.TERRET_MODEL_COMPACTOR = ""
    edit_profile(profile, roles={"main": "test/model", "compactor": "test/model"}, system_prompt="Remember. " * 2_500)
    edit_profile(profile, **change)
    services.run_turn(session.id, "hello")
    assert drive(session.id) == "blocked"
    blocked = blocked_turn(session)
    assert (blocked["code"], blocked["what"]) == ("definition_missing", what)
    assert "refused the request as too long" in blocked["reason"]
    assert events(session, "session/compacted") == []


# -- the ledger's move without the tool (effects.without_definition, pure)


def _ledger(*steps: tuple[str, dict[str, Any]]) -> effects.CallLedger | None:
    events_ = [LoggedEvent(seq, kind, {"call_id": "c", **data}) for seq, (kind, data) in enumerate(steps, start=1)]
    return effects.ledgers(events_).get("c")


def test_without_its_tool_only_what_the_ledger_settles_moves_a_call() -> None:
    attempt = ("tool/attempt", {"name": "t", "attempt": 1, "replay": "never"})
    assert effects.without_definition(None) is None  # never attempted: the tool must run it
    assert effects.without_definition(_ledger(attempt)) is None  # in flight: the tool's policy decides
    unknown = ("tool/unknown", {"attempt": 1, "reason": "r"})
    assert effects.without_definition(_ledger(attempt, unknown)) == effects.AwaitOperator(1)
    rerun = ("tool/resolved", {"attempt": 1, "action": "rerun", "by": "op"})
    assert effects.without_definition(_ledger(attempt, unknown, rerun)) is None  # a rerun needs the tool
    done = ("tool/resolved", {"attempt": 1, "action": "done", "result": "ok", "by": "op"})
    assert effects.without_definition(_ledger(attempt, unknown, done)) == effects.Settled(1, "operator", "ok")
    result = ("tool/result", {"attempt": 1, "content": "x", "is_error": False})
    assert effects.without_definition(_ledger(attempt, result)) == effects.Settled(1)
