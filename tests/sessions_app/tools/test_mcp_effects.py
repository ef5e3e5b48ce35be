"""MCP tools at the effect ledger, against real stdio servers.

Our effects server (tests/fakes/effects_mcp_server.py) appends one line to
EFFECTS_LOG per execution, with the idempotency key, attempt and fence it
received in the request's `_meta`: counting lines is counting executions at
the target. mcp-server-time is the real server from PyPI.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters, stdio_client
from mcp.types import Tool

from approvals_app import gate
from approvals_app import services as approvals
from sessions_app import log, services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime import effects
from sessions_app.runtime.drive import drive
from sessions_app.services import effects as effect_services
from sessions_app.tools import mcp, registry
from sessions_app.tools.base import Definition, ToolContext
from sessions_app.tools.executor import execute
from tests.fakes.effects_mcp_server import executions, fx_server
from tests.fakes.fake_llm import Reply
from tests.helpers import events, kinds

TIME = {"name": "time", "command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


def raw_tools(config: dict[str, Any]) -> dict[str, Tool]:
    """The tools as the server declares them, read with the SDK directly
    (not through Terret's manager)."""

    async def listing() -> list[Tool]:
        params = StdioServerParameters(command=config["command"], args=config["args"], env=config.get("env"))
        async with Client(stdio_client(params)) as client:
            return list((await client.list_tools()).tools)

    return {t.name: t for t in asyncio.run(listing())}


def shape(defn: Definition) -> tuple[bool, bool, str, str]:
    return defn.mutating, defn.idempotent, defn.replay_policy, defn.approval


@pytest.fixture(scope="module", autouse=True)
def stop_servers() -> Iterator[None]:
    yield
    mcp.shutdown()


@pytest.fixture(scope="module")
def effects_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One server process per distinct config, so one log per module; tests
    # tell their executions apart by label.
    return tmp_path_factory.mktemp("fx") / "effects.jsonl"


@pytest.fixture(scope="module")
def fx(effects_log: Path) -> dict[str, Any]:
    return fx_server(effects_log)


def labelled(effects_log: Path, label: str) -> list[dict[str, Any]]:
    return [e for e in executions(effects_log) if e["label"] == label]


# -- policy from annotations ------------------------------------------------


def test_the_server_declares_the_annotations_the_tests_rely_on(fx: dict[str, Any]) -> None:
    declared = raw_tools(fx)
    assert declared["lookup"].annotations is not None and declared["lookup"].annotations.read_only_hint is True
    upsert = declared["upsert"].annotations
    assert upsert is not None
    assert (upsert.read_only_hint, upsert.destructive_hint, upsert.idempotent_hint) == (False, False, True)
    assert declared["mutate"].annotations is None
    destroy = declared["destroy"].annotations
    assert destroy is not None and destroy.read_only_hint is None
    assert (destroy.destructive_hint, destroy.idempotent_hint) == (True, True)


def test_policy_follows_the_annotations(fx: dict[str, Any]) -> None:
    tools = {d.name: d for d in mcp.list_tools(fx)}
    assert set(tools) == {"mcp.fx.lookup", "mcp.fx.upsert", "mcp.fx.mutate", "mcp.fx.destroy"}
    assert shape(tools["mcp.fx.lookup"]) == (False, True, "safe", "never")
    assert shape(tools["mcp.fx.upsert"]) == (True, True, "safe", "policy")
    # No annotations: MCP's defaults (may change things, not idempotent).
    assert shape(tools["mcp.fx.mutate"]) == (True, False, "never", "policy")
    # Destructive wins over idempotent.
    assert shape(tools["mcp.fx.destroy"]) == (True, True, "never", "policy")
    for defn in tools.values():
        assert defn.replay == defn.replay_policy  # declared, not derived
        assert not defn.runs_inline  # every MCP call records its intent first


def test_the_policy_approval_mode_asks_for_every_mutating_tool(fx: dict[str, Any]) -> None:
    tools = {d.name: d for d in mcp.list_tools(fx)}
    for name, asks in [("lookup", False), ("upsert", True), ("mutate", True), ("destroy", True)]:
        defn = tools[f"mcp.fx.{name}"]
        assert gate.needs_approval(defn, {defn.name: "policy"}) is asks, name
        assert gate.needs_approval(defn, {}) is asks, name  # the default is the tool's own: policy or never
        assert gate.needs_approval(defn, {defn.name: "never"}) is False


def test_time_server_tools_follow_what_it_declares() -> None:
    declared = raw_tools(TIME)
    tools = {d.name: d for d in mcp.list_tools(TIME)}
    assert set(tools) == {f"mcp.time.{name}" for name in declared}
    for name, tool in declared.items():
        hints = tool.annotations
        defn = tools[f"mcp.time.{name}"]
        if hints is not None and hints.read_only_hint is True:
            assert shape(defn) == (False, True, "safe", "never"), name
        else:
            assert defn.mutating and defn.approval == "policy", name
    # What mcp-server-time declares today: both tools read-only.
    assert all(t.annotations and t.annotations.read_only_hint for t in declared.values())


# -- the key reaches the server ---------------------------------------------


def test_a_keyed_call_delivers_key_attempt_and_fence(fx: dict[str, Any], effects_log: Path, tmp_path: Path) -> None:
    upsert = {d.name: d for d in mcp.list_tools(fx)}["mcp.fx.upsert"]
    ctx = ToolContext(uuid.uuid4(), "call-1", tmp_path, idempotency_key="terret:s:7:call-1", attempt=2, fence=5)
    outcome = execute(upsert, ctx, json.dumps({"label": "keyed"}))
    assert (outcome.content, outcome.is_error) == ("upserted keyed", False)
    (seen,) = labelled(effects_log, "keyed")
    assert (seen["tool"], seen["key"], seen["attempt"], seen["fence"]) == ("upsert", "terret:s:7:call-1", 2, 5)


def test_a_call_without_a_key_sends_none(fx: dict[str, Any], effects_log: Path, tmp_path: Path) -> None:
    lookup = {d.name: d for d in mcp.list_tools(fx)}["mcp.fx.lookup"]
    outcome = execute(lookup, ToolContext(uuid.uuid4(), "call-2", tmp_path), json.dumps({"label": "unkeyed"}))
    assert outcome.content == "looked up unkeyed"
    (seen,) = labelled(effects_log, "unkeyed")
    assert (seen["key"], seen["attempt"], seen["fence"]) == (None, None, None)
    # The module-level call_tool still works without meta, and passes it when given.
    assert mcp.call_tool(fx, "lookup", {"label": "plain"}) == "looked up plain"
    assert mcp.call_tool(fx, "lookup", {"label": "meta"}, meta={mcp.META_IDEMPOTENCY_KEY: "k"}) == "looked up meta"
    assert [e["key"] for e in labelled(effects_log, "plain")] == [None]
    assert [e["key"] for e in labelled(effects_log, "meta")] == ["k"]


def test_ledger_meta_is_empty_without_a_key(tmp_path: Path) -> None:
    assert mcp.ledger_meta(ToolContext(uuid.uuid4(), "c", tmp_path)) is None
    keyed = ToolContext(uuid.uuid4(), "c", tmp_path, idempotency_key="k", attempt=1, fence=3)
    assert mcp.ledger_meta(keyed) == {"io.terret/idempotency_key": "k", "io.terret/attempt": 1, "io.terret/fence": 3}


# -- real turns on PostgreSQL -------------------------------------------------


@pytest.fixture
def turn_log(tmp_path: Path) -> Path:
    return tmp_path / "turn-effects.jsonl"


@pytest.fixture
def profile(db: None, turn_log: Path) -> AgentProfile:
    registry.clear_cache()
    return AgentProfile.objects.create(
        name="fx",
        roles={"main": "test/model"},
        builtin_tools=[],
        mcp_servers=[fx_server(turn_log)],
        allow_floor=["*"],
    )


def set_approvals(profile: AgentProfile, **approvals: str) -> None:
    AgentProfile.objects.filter(pk=profile.pk).update(approvals=approvals)
    registry.clear_cache()


turn = pytest.mark.django_db(transaction=True)


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
@turn
def test_a_turn_asks_before_upsert_then_sends_the_attempts_key_once(
    fake_llm: Any, session: Session, turn_log: Path, make_reviewer: Any
) -> None:
    fake_llm.script(Reply(tool_calls=[("mcp.fx.upsert", {"label": "e2e"})]), Reply(text="done"))
    services.run_turn(session.id, "upsert it")
    # Mutating by annotation: the policy mode asks a human first; nothing ran.
    assert drive(session.id) == "parked"
    (request,) = events(session, "approval/requested")
    assert request["name"] == "mcp.fx.upsert"
    assert executions(turn_log) == []
    approvals.decide(session.id, request["call_id"], "approve", user=make_reviewer("rev"))
    assert drive(session.id) == "ended"

    (attempt,) = events(session, "tool/attempt")
    message_seq, message = (
        Event.objects.filter(session=session, kind="assistant/message").order_by("seq").values_list("seq", "data")[0]
    )
    call_id = message["tool_calls"][0]["id"]
    key = effects.idempotency_key(session.id, message_seq, call_id)
    assert (attempt["call_id"], attempt["name"], attempt["attempt"]) == (call_id, "mcp.fx.upsert", 1)
    assert (attempt["replay"], attempt["idempotency_key"]) == ("safe", key)
    (result,) = events(session, "tool/result")
    assert (result["content"], result["is_error"], result["attempt"]) == ("upserted e2e", False, 1)
    # The target ran it exactly once, under that attempt's key and fence.
    (seen,) = executions(turn_log)
    assert (seen["tool"], seen["key"], seen["attempt"], seen["fence"]) == ("upsert", key, 1, attempt["fence"])
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert effects.effects_audit(session.id).ok


def crashed_in_flight(session: Session, tool: str, label: str) -> tuple[str, str]:
    """The log a worker leaves when it dies inside an MCP call: the intent
    (tool/attempt 1) committed, no outcome. Returns the call id and key."""
    opening: list[tuple[str, dict[str, Any]]] = [
        ("turn/start", {}),
        ("user/message", {"text": "go"}),
        ("step/start", {"step": 1, "model": "m"}),
    ]
    for kind, data in opening:
        log.append(session.id, kind, data)
    call = {"id": "call_fx1", "name": f"mcp.fx.{tool}", "arguments": json.dumps({"label": label})}
    message = log.append(session.id, "assistant/message", {"content": "", "tool_calls": [call]})
    key = effects.idempotency_key(session.id, message.seq, call["id"])
    intent = {"call_id": call["id"], "name": call["name"], "attempt": 1, "idempotency_key": key}
    log.append(session.id, "tool/attempt", {**intent, "replay": "safe" if tool == "upsert" else "never", "fence": 1})
    return call["id"], key


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
@turn
def test_an_upsert_in_flight_at_a_crash_runs_again_under_the_same_key(
    fake_llm: Any, session: Session, profile: AgentProfile, turn_log: Path
) -> None:
    set_approvals(profile, **{"mcp.fx.upsert": "never"})
    call_id, key = crashed_in_flight(session, "upsert", "again")
    fake_llm.script(Reply(text="done"))
    assert drive(session.id) == "ended"
    assert [a["attempt"] for a in events(session, "tool/attempt")] == [1, 2]
    assert [(r["call_id"], r["attempt"]) for r in events(session, "tool/result")] == [(call_id, 2)]
    # The target saw the second attempt only (the first is the crash we wrote),
    # under the key of the first: it can tell the repeat.
    assert [(e["key"], e["attempt"]) for e in executions(turn_log)] == [(key, 2)]
    assert events(session, "turn/end") == [{"status": "completed"}]


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
@turn
def test_the_audit_accepts_a_safe_re_run_after_a_crash(
    fake_llm: Any, session: Session, profile: AgentProfile, turn_log: Path
) -> None:
    set_approvals(profile, **{"mcp.fx.upsert": "never"})
    crashed_in_flight(session, "upsert", "audited")
    fake_llm.script(Reply(text="done"))
    assert drive(session.id) == "ended"
    assert len(executions(turn_log)) == 1
    audit = effects.effects_audit(session.id)
    assert audit.ok, audit.problems
    assert audit.counts == {"superseded": 1, "done": 1, "calls": 1}
    first, second = effects.effects(session.id)
    assert (first.state, second.state, second.attempt) == ("superseded", "done", 2)


@pytest.mark.postgres
@pytest.mark.usefixtures("manual_worker")
@turn
def test_a_mutate_in_flight_at_a_crash_is_not_run_again(
    fake_llm: Any, session: Session, profile: AgentProfile, turn_log: Path
) -> None:
    set_approvals(profile, **{"mcp.fx.mutate": "never"})
    call_id, key = crashed_in_flight(session, "mutate", "once")
    assert drive(session.id) == "parked"
    (unknown,) = events(session, "tool/unknown")
    assert (unknown["call_id"], unknown["attempt"]) == (call_id, 1)
    session.refresh_from_db()
    assert session.status == "waiting_reconcile"
    assert executions(turn_log) == []  # not re-run blindly
    assert "tool/result" not in kinds(session)
    # An operator's rerun runs it once more, as attempt 2 under the same key.
    effect_services.resolve(session.id, call_id, "rerun", by="operator")
    fake_llm.script(Reply(text="done"))
    assert drive(session.id) == "ended"
    assert [(e["key"], e["attempt"]) for e in executions(turn_log)] == [(key, 2)]
    assert [(r["content"], r["attempt"]) for r in events(session, "tool/result")] == [("mutated once", 2)]
    audit = effects.effects_audit(session.id)
    assert audit.ok, audit.problems
