"""The effect ledger against real Celery worker processes killed with SIGKILL.

A worker dies between an effect's intent (tool/attempt) and its outcome, or
just after the outcome committed; a fresh worker process takes the sessions
over (liveness makes that immediate on PostgreSQL) and does what the tool's
replay policy allows, and no more. Executions are counted at the target:
debug.charge appends one line per execution to the session's charges.log;
a workspace.write is seen in its file's inode and mtime. The kill lands at
an exact point when the worker pauses there (TERRET_FAILPOINTS).
The audit counts are printed for the record (run with -s)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, DocumentVersion, Event, Session
from sessions_app.runtime.effects import effects, effects_audit
from sessions_app.runtime.owned.audit import tasks_audit
from sessions_app.services.effects import resolve
from sessions_app.tools.builtins import CHARGES_FILE, workspace_dir
from tests.fakes.effects_mcp_server import executions, fx_server
from tests.fakes.fake_llm import Reply, responder_for_mode
from tests.helpers import events, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

CHARGE_WAIT = 5  # seconds debug.charge waits before its effect: the window the kill lands in


@pytest.fixture
def make_session(make_user: Any, settings: Any, tmp_path: Path) -> Callable[[], Session]:
    settings.TERRET_WORKSPACE_ROOT = tmp_path  # read by worker_env when a worker starts
    owner = make_user()
    profile = AgentProfile.objects.create(
        name="effects-kill",
        roles={"main": "test/model"},
        builtin_tools=["debug.charge", "debug.sleep", "debug.noop", "workspace.write"],
        allow_floor=["*"],
        approvals={"workspace.write": "never"},  # no human in these tests: the write runs when called
    )
    return lambda: services.create_session(owner, profile)


def log_of(session: Session) -> list[tuple[int, str, dict[str, Any]]]:
    return list(Event.objects.filter(session=session).order_by("seq").values_list("seq", "kind", "data"))


def kinds_of(session: Session) -> list[str]:
    return [k for _, k, _ in log_of(session)]


def has(session: Session, kind: str) -> bool:
    return Event.objects.filter(session=session, kind=kind).exists()


def status(session: Session) -> str:
    return Session.objects.get(id=session.id).status


def is_status(session: Session, expected: str) -> bool:
    return status(session) == expected


def charges(session: Session) -> list[dict[str, Any]]:
    """One line per execution of debug.charge, as the target recorded it."""
    path = workspace_dir(session.id) / CHARGES_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_recovered(session: Session, label: str) -> None:
    """Gapless seqs, one turn, ended completed, and a clean effect audit."""
    entries = log_of(session)
    assert [seq for seq, _, _ in entries] == list(range(1, len(entries) + 1)), "seqs must be gapless"
    kinds = [k for _, k, _ in entries]
    assert kinds.count("turn/start") == 1
    assert kinds.count("turn/end") == 1
    assert [d for _, k, d in entries if k == "turn/end"] == [{"status": "completed"}]
    audit = effects_audit(session.id)
    print(f"\neffects_audit [{label}] counts={audit.counts} ok={audit.ok} problems={audit.problems}")
    assert audit.ok, audit.problems
    tasks = tasks_audit(session.id)
    assert tasks.ok, tasks.problems


def test_kill_9_between_intent_and_effect_of_a_never_tool_waits_for_an_operator(
    start_worker: Any, fake_llm: Any, make_session: Callable[[], Session]
) -> None:
    """Three sessions die inside debug.charge's wait, before its effect; the
    fresh worker runs none of them again, and each operator's answer is
    carried out exactly: rerun charges once (attempt 2, same key), done and
    failed charge nothing, and every turn completes."""
    fake_llm.responder = responder_for_mode("tool-then-final", "debug.charge", {"seconds": CHARGE_WAIT})
    sessions = {action: make_session() for action in ("done", "rerun", "failed")}
    first = start_worker(name="a")
    started = time.monotonic()
    for session in sessions.values():
        services.inject(session.id, "charge it", wake=True)
    wait_for(lambda: all(has(s, "tool/attempt") for s in sessions.values()), timeout=CHARGE_WAIT - 2, what="intents")
    time.sleep(0.3)  # every worker thread is inside the charge's wait now
    first.kill()
    assert time.monotonic() - started < CHARGE_WAIT, "the kill must land before the first charge's effect"
    for session in sessions.values():
        assert charges(session) == [], "killed between intent and effect: nothing was charged"
        assert not has(session, "tool/result")

    start_worker(name="b")
    for session in sessions.values():
        wait_for(partial(is_status, session, "waiting_reconcile"), timeout=30, what="waiting_reconcile")
    time.sleep(CHARGE_WAIT + 0.5)  # had anything re-run the charge, its line would be there by now
    keys = {}
    for session in sessions.values():
        assert charges(session) == [], "a `never` tool is not re-run by a resume"
        (attempt,) = events(session, "tool/attempt")
        (unknown,) = events(session, "tool/unknown")
        assert unknown["attempt"] == 1 and unknown["call_id"] == attempt["call_id"]
        assert not has(session, "tool/result")
        (effect,) = effects(session.id)
        assert (effect.state, effect.replay, effect.turn_open) == ("unknown", "never", True)
        keys[session.id] = attempt["idempotency_key"]

    operator_text = "charged once, per the bank's statement"
    for action, session in sessions.items():
        call_id = events(session, "tool/attempt")[0]["call_id"]
        resolve(session.id, call_id, action, result=operator_text if action == "done" else "", by="ops")
    for session in sessions.values():
        wait_for(partial(has, session, "turn/end"), timeout=30 + CHARGE_WAIT, what="turn/end after resolve")

    for action, session in sessions.items():
        assert_recovered(session, f"never, killed before the effect, resolved {action}")
        assert events(session, "assistant/message")[-1]["content"] == "done", "the model's final reply"
        lines = charges(session)
        (result,) = events(session, "tool/result")
        attempts = events(session, "tool/attempt")
        key = keys[session.id]
        if action == "rerun":
            (line,) = lines
            assert line["attempt"] == 2 and line["idempotency_key"] == key
            assert [(a["attempt"], a["idempotency_key"]) for a in attempts] == [(1, key), (2, key)]
            assert (attempts[1]["replaces"], attempts[1]["why"]) == (1, "rerun")
            assert attempts[0]["worker"] != attempts[1]["worker"]
            assert result["attempt"] == 2 and not result["is_error"] and "via" not in result
        else:
            assert lines == [], f"{action}: the operator's answer runs nothing"
            assert [a["attempt"] for a in attempts] == [1]
            assert result["attempt"] == 1 and result["via"] == "operator"
            assert result["is_error"] is (action == "failed")
            if action == "done":
                assert result["content"] == operator_text
        assert status(session) == "idle"


def test_kill_9_after_the_outcome_committed_does_not_run_it_again(
    start_worker: Any, fake_llm: Any, make_session: Callable[[], Session]
) -> None:
    fake_llm.script(
        Reply(tool_calls=[("debug.charge", {"seconds": 0})]),
        Reply(text="this stream never finishes", hang=True),
        Reply(text="finished"),
    )
    session = make_session()
    first = start_worker(name="a")
    services.inject(session.id, "charge it", wake=True)
    wait_for(lambda: len(fake_llm.requests) == 2, what="the model call after the charge")
    time.sleep(0.3)
    first.kill()
    assert has(session, "tool/result") and not has(session, "turn/end")
    assert len(charges(session)) == 1

    start_worker(name="b")
    wait_for(lambda: has(session, "turn/end"), timeout=40, what="turn/end after recovery")
    assert_recovered(session, "never, killed after the outcome")
    (line,) = charges(session)
    (attempt,) = events(session, "tool/attempt")
    (result,) = events(session, "tool/result")
    assert line["attempt"] == 1 and line["idempotency_key"] == attempt["idempotency_key"]
    assert result["attempt"] == 1 and not result["is_error"] and "via" not in result
    assert "tool/unknown" not in kinds_of(session)
    assert events(session, "assistant/message")[-1]["content"] == "finished"
    assert len(fake_llm.requests) == 3


def test_kill_9_mid_safe_tool_reruns_it_once_under_the_same_key(
    start_worker: Any, fake_llm: Any, make_session: Callable[[], Session]
) -> None:
    fake_llm.script(Reply(tool_calls=[("debug.sleep", {"seconds": 4})]), Reply(text="rested"))
    session = make_session()
    first = start_worker(name="a")
    services.inject(session.id, "sleep a little", wake=True)
    wait_for(lambda: has(session, "tool/attempt"), what="the intent")
    time.sleep(0.5)  # the worker is inside debug.sleep
    first.kill()
    assert not has(session, "tool/result")

    start_worker(name="b")
    wait_for(lambda: has(session, "turn/end"), timeout=40, what="turn/end after recovery")
    assert_recovered(session, "safe, killed mid-tool")
    attempts = events(session, "tool/attempt")
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["idempotency_key"] == attempts[1]["idempotency_key"]
    assert (attempts[1]["replaces"], attempts[1]["why"]) == (1, "safe")
    assert attempts[0]["worker"] != attempts[1]["worker"]
    assert [e.state for e in effects(session.id)] == ["superseded", "done"]
    (result,) = events(session, "tool/result")
    assert result["attempt"] == 2 and result["content"] == "slept 4" and "via" not in result
    assert "tool/unknown" not in kinds_of(session)
    assert len(fake_llm.requests) == 2


PAUSE = 30  # the failpoint's pause: far longer than the kill takes to land


def versions(session: Session, name: str) -> list[bytes]:
    """The document's versions, oldest first: one per write that took effect."""
    rows = DocumentVersion.objects.filter(document__session=session, document__name=name).order_by("version")
    return [bytes(v.content.data) for v in rows.select_related("content")]


@pytest.mark.parametrize("point", ["after_intent", "after_effect"])
def test_kill_9_of_a_write_reconciles_with_the_file(
    point: str, start_worker: Any, fake_llm: Any, make_session: Callable[[], Session]
) -> None:
    """kill -9 with the write's intent committed: before the write ran
    (after_intent) the target says not done and the write runs once, as
    attempt 2; after it ran (after_effect) the target says done, and the
    document is not written again (one version)."""
    args = {"path": "report.txt", "content": "the quarterly report"}
    fake_llm.script(Reply(tool_calls=[("workspace.write", args)]), Reply(text="written"))
    session = make_session()
    first = start_worker(name="a", TERRET_FAILPOINTS=f"{point}:workspace.write={PAUSE}")
    services.inject(session.id, "write the report", wake=True)
    if point == "after_intent":
        wait_for(lambda: has(session, "tool/attempt"), what="the intent")
        time.sleep(0.3)  # the worker sits in the failpoint, before the write
        assert versions(session, "report.txt") == []
    else:
        wait_for(lambda: versions(session, "report.txt"), what="the write's effect")
        time.sleep(0.3)  # the worker sits in the failpoint, before the result commits
    first.kill()
    assert not has(session, "tool/result")

    start_worker(name="b")
    wait_for(lambda: has(session, "turn/end"), timeout=40, what="turn/end after recovery")
    assert_recovered(session, f"reconcile, killed {point}")
    assert versions(session, "report.txt") == [args["content"].encode()]  # written once, either way
    attempts = events(session, "tool/attempt")
    (result,) = events(session, "tool/result")
    assert result["is_error"] is False and result["content"] == "wrote 20 bytes to report.txt"
    if point == "after_intent":
        assert [(a["attempt"], a.get("why")) for a in attempts] == [(1, None), (2, "not_done")]
        assert result["attempt"] == 2 and "via" not in result
        assert [e.state for e in effects(session.id)] == ["superseded", "done"]
    else:
        assert [a["attempt"] for a in attempts] == [1]
        assert (result["attempt"], result["via"]) == (1, "reconcile")
        assert [e.state for e in effects(session.id)] == ["done"]
    assert "tool/unknown" not in kinds_of(session)
    assert len(fake_llm.requests) == 2


def test_kill_9_after_a_safe_mcp_call_ran_runs_it_once_more_under_the_same_key(
    start_worker: Any, fake_llm: Any, make_user: Any, settings: Any, tmp_path: Path
) -> None:
    """A real MCP server's idempotent tool ran, and the worker died before
    its result committed: the fresh worker runs it again, once, and the
    server sees the same idempotency key both times (the server, not the
    log, counts the executions), so it could have deduplicated."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    effects_log = tmp_path / "fx-effects.jsonl"
    profile = AgentProfile.objects.create(
        name="effects-kill-mcp",
        roles={"main": "test/model"},
        mcp_servers=[fx_server(effects_log)],
        allow_floor=["*"],
        approvals={"mcp.fx.upsert": "never"},
    )
    session = services.create_session(make_user(), profile)
    fake_llm.script(Reply(tool_calls=[("mcp.fx.upsert", {"label": "row 7"})]), Reply(text="upserted"))
    first = start_worker(name="a", TERRET_FAILPOINTS=f"after_effect:mcp.fx.upsert={PAUSE}")
    services.inject(session.id, "upsert row 7", wake=True)
    wait_for(lambda: executions(effects_log), timeout=40, what="the server's first execution")
    time.sleep(0.3)  # the worker sits in the failpoint, before the result commits
    first.kill()
    assert not has(session, "tool/result")

    start_worker(name="b")
    wait_for(lambda: has(session, "turn/end"), timeout=40, what="turn/end after recovery")
    assert_recovered(session, "safe MCP tool, killed after its effect")
    runs = executions(effects_log)
    attempts = events(session, "tool/attempt")
    assert [(r["tool"], r["attempt"]) for r in runs] == [("upsert", 1), ("upsert", 2)], "ran again once"
    assert {r["key"] for r in runs} == {attempts[0]["idempotency_key"]}, "one key for both executions"
    assert (attempts[1]["replaces"], attempts[1]["why"], attempts[1]["replay"]) == (1, "safe", "safe")
    assert [e.state for e in effects(session.id)] == ["superseded", "done"]
