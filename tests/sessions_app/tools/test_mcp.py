"""MCP servers over stdio: a real server from PyPI and our own slow one."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest

from sessions_app.models import AgentProfile
from sessions_app.tools import mcp, registry
from sessions_app.tools.base import ToolContext, ToolError
from sessions_app.tools.executor import MAX_RESULT_BYTES, execute

SLOW_SERVER = str(Path(__file__).resolve().parents[3] / "tests" / "fakes" / "slow_mcp_server.py")
TIME = {"name": "time", "command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
SLOW = {"name": "slow", "command": sys.executable, "args": [SLOW_SERVER]}


@pytest.fixture(scope="module", autouse=True)
def stop_servers():
    yield
    mcp.shutdown()


@pytest.fixture
def ctx(tmp_path) -> ToolContext:
    return ToolContext(uuid.uuid4(), "call-1", tmp_path)


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is gone once it is not running.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1].startswith("Z")


# -- mcp-server-time, from PyPI ------------------------------------------------


def test_time_server_lists_its_tools():
    tools = {d.name: d for d in mcp.list_tools(TIME)}
    assert set(tools) == {"mcp.time.get_current_time", "mcp.time.convert_time"}
    current = tools["mcp.time.get_current_time"]
    assert current.parameters["type"] == "object"
    assert current.parameters["required"] == ["timezone"]
    assert "timezone" in current.description.lower() or "time" in current.description.lower()
    # Annotated read-only, so nobody is asked before it runs.
    assert (current.approval, current.mutating, current.idempotent) == ("never", False, True)


def test_time_server_get_current_time():
    text = mcp.call_tool(TIME, "get_current_time", {"timezone": "Europe/Paris"})
    payload = json.loads(text)
    assert payload["timezone"] == "Europe/Paris"
    assert datetime.fromisoformat(payload["datetime"]).utcoffset() is not None


def test_time_server_tool_error_becomes_tool_error():
    with pytest.raises(ToolError, match="Invalid timezone"):
        mcp.call_tool(TIME, "get_current_time", {"timezone": "Not/AZone"})


def test_unknown_tool_is_a_tool_error():
    with pytest.raises(ToolError, match="Unknown tool"):
        mcp.call_tool(TIME, "no_such_tool", {})


@pytest.mark.django_db
def test_registry_names_mcp_tools_and_applies_overrides(ctx):
    registry.clear_cache()
    profile = AgentProfile.objects.create(
        name="timekeeper",
        builtin_tools=["clock.now"],
        mcp_servers=[TIME],
        approvals={"mcp.time.convert_time": "always"},
    )
    reg = registry.registry_for_profile(profile)
    assert reg.names() == ["clock.now", "mcp.time.convert_time", "mcp.time.get_current_time"]
    assert reg["mcp.time.convert_time"].approval == "always"
    assert reg["mcp.time.get_current_time"].approval == "never"
    assert [s.name for s in reg.specs()] == reg.names()

    outcome = execute(reg["mcp.time.get_current_time"], ctx, '{"timezone": "UTC"}')
    assert not outcome.is_error
    assert json.loads(outcome.content)["timezone"] == "UTC"

    # The schema from the server is enforced before the server is asked.
    invalid = execute(reg["mcp.time.get_current_time"], ctx, "{}")
    assert invalid.is_error
    assert '"timezone" is a required property' in invalid.content
    registry.clear_cache()


# -- our slow server -----------------------------------------------------------


def test_slow_server_tools_and_annotations():
    tools = {d.name: d for d in mcp.list_tools(SLOW)}
    assert {"mcp.slow.echo", "mcp.slow.slow", "mcp.slow.fail", "mcp.slow.add_note"} <= set(tools)
    assert tools["mcp.slow.echo"].approval == "never"
    assert tools["mcp.slow.echo"].mutating is False
    note = tools["mcp.slow.add_note"]
    assert (note.approval, note.mutating, note.idempotent) == ("policy", True, False)
    # No annotations at all: MCP's defaults (may change things, not
    # idempotent), so the policy mode asks and a crash is not re-run blindly.
    fail = tools["mcp.slow.fail"]
    assert (fail.approval, fail.mutating, fail.idempotent, fail.replay_policy) == ("policy", True, False, "never")


def test_listing_is_cached():
    mcp.list_tools(SLOW)
    started = time.monotonic()
    for _ in range(20):
        mcp.list_tools(SLOW)
    assert time.monotonic() - started < 0.5


def test_echo_roundtrip(ctx):
    assert mcp.call_tool(SLOW, "echo", {"text": "héllo"}) == "héllo"
    echo = {d.name: d for d in mcp.list_tools(SLOW)}["mcp.slow.echo"]
    assert echo.handler(ctx, {"text": "via handler"}) == "via handler"


def test_slow_call_completes():
    started = time.monotonic()
    assert mcp.call_tool(SLOW, "slow", {"seconds": 0.5}) == "done after 0.5s"
    assert time.monotonic() - started >= 0.5


def test_call_exceeding_its_timeout_raises_and_the_server_keeps_working():
    started = time.monotonic()
    with pytest.raises(ToolError, match="timed out after 0.3s"):
        mcp.call_tool(SLOW, "slow", {"seconds": 5}, timeout=0.3)
    assert time.monotonic() - started < 3
    assert mcp.call_tool(SLOW, "echo", {"text": "still here"}) == "still here"


def test_timeout_from_the_server_config():
    with pytest.raises(ToolError, match="timed out after 0.2s"):
        mcp.call_tool({**SLOW, "timeout": 0.2}, "slow", {"seconds": 5})


def test_failing_tool_raises_tool_error_with_its_text(ctx):
    with pytest.raises(ToolError, match="this tool always fails"):
        mcp.call_tool(SLOW, "fail", {})
    fail = {d.name: d for d in mcp.list_tools(SLOW)}["mcp.slow.fail"]
    outcome = execute(fail, ctx, "{}")
    assert outcome.is_error
    assert "this tool always fails" in outcome.content


def test_large_result_is_truncated_by_the_executor(ctx):
    big = {d.name: d for d in mcp.list_tools(SLOW)}["mcp.slow.big"]
    outcome = execute(big, ctx, json.dumps({"size": 3 * MAX_RESULT_BYTES}))
    assert not outcome.is_error
    assert outcome.content.endswith(f"only the first {MAX_RESULT_BYTES} are shown]")


def test_concurrent_calls_from_many_threads_share_one_server():
    pids = {mcp.call_tool(SLOW, "pid", {})}
    barrier = threading.Barrier(8)

    def work(i: int) -> tuple[str, str]:
        barrier.wait()
        return mcp.call_tool(SLOW, "slow", {"seconds": 1}), mcp.call_tool(SLOW, "echo", {"text": str(i)})

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(8)))
        pids |= set(pool.map(lambda _: mcp.call_tool(SLOW, "pid", {}), range(8)))
    elapsed = time.monotonic() - started
    assert results == [("done after 1s", str(i)) for i in range(8)]
    assert elapsed < 4, f"calls were serialized ({elapsed:.1f}s for 8 x 1s)"
    assert len(pids) == 1


def test_concurrent_first_use_starts_one_server():
    config = {"name": "fresh", "command": sys.executable, "args": [SLOW_SERVER, "--fresh"]}
    with ThreadPoolExecutor(6) as pool:
        pids = set(pool.map(lambda _: mcp.call_tool(config, "pid", {}), range(6)))
    assert len(pids) == 1


def test_killed_server_is_restarted_on_the_next_call():
    old_pid = int(mcp.call_tool(SLOW, "pid", {}))
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not mcp.manager().is_running(SLOW))
    new_pid = int(mcp.call_tool(SLOW, "pid", {}))
    assert new_pid != old_pid
    assert mcp.call_tool(SLOW, "echo", {"text": "back"}) == "back"
    assert process_gone(old_pid)


def test_server_dying_mid_call_fails_that_call_only():
    pid = int(mcp.call_tool(SLOW, "pid", {}))
    killer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(mcp.MCPUnavailable, match="exited during the call"):
        mcp.call_tool(SLOW, "slow", {"seconds": 10})
    killer.join()
    assert int(mcp.call_tool(SLOW, "pid", {})) != pid


def test_server_that_cannot_start_is_reported_and_backs_off():
    config = {"name": "nope", "command": "/nonexistent/mcp-server"}
    with pytest.raises(mcp.MCPUnavailable, match="could not start"):
        mcp.list_tools(config)
    started = time.monotonic()
    with pytest.raises(mcp.MCPUnavailable, match="could not start"):
        mcp.call_tool(config, "anything", {})
    assert time.monotonic() - started < 1


def test_server_that_exits_at_once_is_reported():
    config = {"name": "quitter", "command": sys.executable, "args": ["-c", "print('not mcp')"]}
    with pytest.raises(mcp.MCPUnavailable, match="could not start"):
        mcp.list_tools(config)


def test_shutdown_stops_servers_and_the_manager_can_start_again():
    manager = mcp.MCPManager()
    pid = int(manager.call_tool(SLOW, "pid", {}))
    manager.shutdown()
    wait_until(lambda: process_gone(pid))
    assert int(manager.call_tool(SLOW, "pid", {})) != pid
    manager.shutdown()


def test_sync_api_refuses_its_own_loop_thread():
    manager = mcp.MCPManager()
    loop = manager._ensure_loop()
    failures: list[BaseException] = []

    def on_loop() -> None:
        try:
            manager.list_tools(SLOW)
        except RuntimeError as exc:
            failures.append(exc)

    loop.call_soon_threadsafe(on_loop)
    wait_until(lambda: bool(failures))
    assert "own loop thread" in str(failures[0])
    manager.shutdown()
