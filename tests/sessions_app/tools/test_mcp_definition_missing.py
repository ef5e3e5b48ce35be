"""An MCP tool whose server stops listing it, or a server that fails to
start, while a call to it is owed: the turn is blocked `definition_missing`
(naming the tool or the server), never an "unknown tool" result for the
model; restoring the server and a retry completes the call once.

The server is our effects server (tests/fakes/effects_mcp_server.py), a real
stdio MCP server that appends one line per execution to its log: counting
lines is counting executions at the target. "Stops listing" is a release of
it started with EFFECTS_HIDE; "fails to start" one with EFFECTS_FAIL_START.
The owed call is parked on an approval (real Celery workers on PostgreSQL,
the retry over the JSON API) or was in flight at a crash (a manual drive).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from approvals_app import services as approvals
from sessions_app import services
from sessions_app.models import AgentProfile, Session
from sessions_app.runtime import effects
from sessions_app.runtime.drive import drive
from sessions_app.services import effects as effect_services
from sessions_app.services import operators
from sessions_app.services import versions as version_services
from sessions_app.tools import registry
from tests.fakes.effects_mcp_server import executions, fx_server, hide_now
from tests.fakes.fake_llm import Reply
from tests.helpers import edit_profile, events, wait_for
from tests.sessions_app.apiutil import bearer, call, session_url, token_for
from tests.sessions_app.tools.test_mcp_effects import crashed_in_flight

turn = pytest.mark.django_db(transaction=True)


@pytest.fixture
def effects_log(tmp_path: Path) -> Path:
    return tmp_path / "effects.jsonl"


@pytest.fixture
def hide_file(tmp_path: Path) -> Path:
    """What the running server hides (tests.fakes.effects_mcp_server.hide_now)."""
    return tmp_path / "hidden.txt"


@pytest.fixture
def profile(db: None, effects_log: Path, hide_file: Path) -> AgentProfile:
    registry.clear_cache()
    return AgentProfile.objects.create(
        name="fx-defs",
        roles={"main": "test/model"},
        mcp_servers=[fx_server(effects_log, hide_file=hide_file)],
        allow_floor=["*"],
    )


def serve(profile: AgentProfile, server: dict[str, Any], session: Session | None = None) -> None:
    """Point the profile at another release of the server (a deploy of it:
    a new agent version). With `session`, whose turn is open, the session
    is moved onto it too (an upgrade through the pre-flight), since a turn
    otherwise runs to its end under the version it opened on."""
    edit_profile(profile, mcp_servers=[server])
    registry.clear_cache()
    if session is not None:
        version_services.upgrade(session.id, None, by="operator")


def blocked(session: Session) -> dict[str, Any]:
    row = Session.objects.get(id=session.id)
    assert row.status == "blocked" and row.open_turn_seq is not None
    assert events(session, "turn/end") == []
    return events(session, "turn/blocked")[-1]


@pytest.mark.postgres
@pytest.mark.worker
@turn
def test_a_parked_call_whose_tool_the_server_stops_listing_blocks_then_runs_once_after_a_retry(
    start_worker: Any,
    fake_llm: Any,
    make_user: Any,
    make_reviewer: Any,
    profile: AgentProfile,
    effects_log: Path,
    hide_file: Path,
) -> None:
    """The server is upgraded in place (the profile, and so the turn's agent
    version, does not change): the worker's listing of it predates the
    upgrade, and the owed call asks the server again before it runs."""
    fake_llm.script(Reply(tool_calls=[("mcp.fx.mutate", {"label": "owed"})]), Reply(text="done"))
    owner = make_user("owner")
    session = services.create_session(owner, profile)
    start_worker()
    services.inject(session.id, "change it", wake=True)
    # mutate has no annotations: mutating, so the `policy` mode asks first.
    (asked,) = wait_for(lambda: events(session, "approval/requested"), timeout=60, what="approval/requested")
    assert asked["name"] == "mcp.fx.mutate"

    hide_now(hide_file, "mutate")  # the running server's new release lists no mutate
    approvals.decide(session.id, asked["call_id"], "approve", user=make_reviewer("rev"))
    wait_for(lambda: events(session, "turn/blocked"), timeout=60, what="turn/blocked")
    stop = blocked(session)
    assert (stop["code"], stop["what"]) == ("definition_missing", "tool:mcp.fx.mutate")
    assert "no longer lists" in stop["reason"]
    assert executions(effects_log) == [] and events(session, "tool/result") == []
    client, auth = Client(), bearer(token_for(owner))
    shown = call(client, "GET", session_url(session), **auth).data
    assert shown["status"] == "blocked"
    assert (shown["blocked"]["code"], shown["blocked"]["what"]) == ("definition_missing", "tool:mcp.fx.mutate")

    hide_now(hide_file)  # restored
    assert call(client, "POST", session_url(session, "/retry"), **auth).status_code == 202
    wait_for(lambda: events(session, "turn/end"), timeout=60, what="turn/end")
    assert events(session, "turn/end") == [{"status": "completed"}]
    # The call ran once at the target, under its first attempt, and the model saw its result.
    (seen,) = executions(effects_log)
    assert (seen["tool"], seen["label"], seen["attempt"]) == ("mutate", "owed", 1)
    (result,) = events(session, "tool/result")
    assert (result["content"], result["is_error"], result["attempt"]) == ("mutated owed", False, 1)
    assert "unknown tool" not in json.dumps(fake_llm.requests)
    assert len(fake_llm.requests) == 2
    assert effects.effects_audit(session.id).ok


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
@turn
def test_an_attempt_in_flight_whose_tool_is_gone_stays_in_the_ledger_then_runs_once(
    fake_llm: Any, session: Session, profile: AgentProfile, effects_log: Path
) -> None:
    edit_profile(profile, approvals={"mcp.fx.upsert": "never"})
    serve(profile, fx_server(effects_log, hide=("upsert",)))
    call_id, key = crashed_in_flight(session, "upsert", "flight")
    assert drive(session.id) == "blocked"
    stop = blocked(session)
    assert (stop["code"], stop["what"]) == ("definition_missing", "tool:mcp.fx.upsert")
    # The attempt of unknown outcome is in front of an operator, its turn open: nothing orphaned.
    (attempt,) = effects.effects(session.id)
    assert (attempt.call_id, attempt.state, attempt.turn_open) == (call_id, "in_flight", True)
    assert effects.effects_audit(session.id).ok
    assert executions(effects_log) == [] and fake_llm.requests == []

    serve(profile, fx_server(effects_log), session)
    fake_llm.script(Reply(text="done"))
    services.retry(session.id, by="operator")
    assert drive(session.id) == "ended"
    assert [(e["key"], e["attempt"]) for e in executions(effects_log)] == [(key, 2)]  # once, a safe re-run
    assert [(r["call_id"], r["attempt"]) for r in events(session, "tool/result")] == [(call_id, 2)]
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert effects.effects_audit(session.id).ok


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
@turn
def test_a_server_that_fails_to_start_blocks_the_call_owed_to_it(
    fake_llm: Any, session: Session, profile: AgentProfile, effects_log: Path
) -> None:
    edit_profile(profile, approvals={"mcp.fx.upsert": "never"})
    serve(profile, fx_server(effects_log, fail_start=True))
    call_id, _ = crashed_in_flight(session, "upsert", "down")
    assert drive(session.id) == "blocked"
    stop = blocked(session)
    assert (stop["code"], stop["what"]) == ("definition_missing", "mcp_server:fx")
    assert "could not start" in stop["reason"]
    assert executions(effects_log) == [] and events(session, "tool/result") == []


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
@turn
def test_an_abandon_moves_a_turn_blocked_on_a_missing_tool_on_and_marks_its_attempt_unknown(
    fake_llm: Any, session: Session, profile: AgentProfile, effects_log: Path
) -> None:
    serve(profile, fx_server(effects_log, hide=("mutate",)))
    call_id, _ = crashed_in_flight(session, "mutate", "left")
    assert drive(session.id) == "blocked"
    operators.abandon(session.id, by="operator", reason="the tool is gone for good")
    (end,) = events(session, "turn/end")
    assert end["status"] == "failed"
    (attempt,) = effects.effects(session.id)
    assert (attempt.call_id, attempt.state) == (call_id, "unknown")  # still before an operator
    assert effects.effects_audit(session.id).ok and executions(effects_log) == []


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
@turn
def test_an_operators_done_settles_an_unknown_attempt_whose_tool_is_gone_without_it(
    fake_llm: Any, session: Session, profile: AgentProfile, effects_log: Path
) -> None:
    edit_profile(profile, approvals={"mcp.fx.mutate": "never"})
    call_id, _ = crashed_in_flight(session, "mutate", "settled")
    assert drive(session.id) == "parked"  # a `never` tool in flight: marked unknown, for an operator
    serve(profile, fx_server(effects_log, hide=("mutate",)), session)  # then the tool goes away
    effect_services.resolve(session.id, call_id, "done", result="it was done", by="operator")
    fake_llm.script(Reply(text="done"))
    assert drive(session.id) == "ended"
    (result,) = events(session, "tool/result")
    assert (result["content"], result["via"], result["attempt"]) == ("it was done", "operator", 1)
    assert events(session, "turn/blocked") == [] and executions(effects_log) == []
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert effects.effects_audit(session.id).ok
