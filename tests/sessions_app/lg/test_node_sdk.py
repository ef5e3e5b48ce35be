"""The official JS client, @langchain/langgraph-sdk (pinned in tests/node/,
installed by .ci/run with `npm ci`), runs the basic flow against a live
daphne and a real Celery worker: thread, stream to the approval interrupt,
state, resume with a decision (tests/node/smoke.mjs); and every method the
door serves called with the client's default arguments (tests/node/defaults.mjs)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.fake_llm import Reply
from tests.helpers import document_text
from tests.sessions_app.lg.conftest import PROFILE
from tests.sessions_app.liveserver import DaphneProcess
from tests.workers import ROOT

pytestmark = [pytest.mark.worker, pytest.mark.timeout(180)]

NODE_DIR = ROOT / "tests" / "node"


def model(body: dict[str, Any]) -> Reply:
    if body["messages"][-1]["role"] == "tool":
        return Reply(text="Written.")
    return Reply(tool_calls=[("workspace.write", {"path": "notes.txt", "content": "from node"})])


@pytest.fixture
def node() -> str:
    found = shutil.which("node")
    if found is None:
        if os.environ.get("TERRET_NO_SKIP") == "1":
            pytest.fail("TERRET_NO_SKIP=1 but node is not installed")
        pytest.skip("needs node (Node 20+) for the JS client")
    if not (NODE_DIR / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        pytest.fail("tests/node has no node_modules: run `npm ci --prefix tests/node` (.ci/run does)")
    return found


async def test_the_js_client_streams_an_interrupt_and_resumes(
    node: str, fake_llm: Any, start_worker: Any, lg_token: str, settings: Any, tmp_path: Path
) -> None:
    fake_llm.responder = model
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    await asyncio.to_thread(start_worker)
    server = await asyncio.to_thread(DaphneProcess(TERRET_WORKER="celery").start)
    env = {**os.environ, "TERRET_LG_URL": f"{server.http}/lg", "TERRET_TOKEN": lg_token, "TERRET_PROFILE": PROFILE}
    try:
        done = await asyncio.to_thread(
            subprocess.run, [node, "smoke.mjs"], cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        server.kill()
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["events"][0] == "metadata"
    assert "values" in out["events"] and "updates" in out["events"]
    # The decoder carries the last id onto id-less frames (end): count changes.
    committed = [i for n, i in enumerate(out["ids"]) if i is not None and (n == 0 or out["ids"][n - 1] != i)]
    assert committed and len(committed) == len(set(committed))
    assert out["action"]["name"] == "workspace.write"
    assert out["action"]["arguments"] == {"path": "notes.txt", "content": "from node"}
    assert out["stateNext"] == ["tools"] and out["taskInterrupts"] == 1
    assert out["runStatus"] == "interrupted"
    assert out["finalTypes"] == ["human", "ai", "tool", "ai"]
    assert out["finalText"] == "Written."
    assert out["threadStatus"] == "idle"
    assert await asyncio.to_thread(document_text, out["threadId"], "notes.txt") == "from node"
    assert len(fake_llm.requests) == 2


def echo(body: dict[str, Any]) -> Reply:
    text = str(body["messages"][-1].get("content") or "")
    if "slow" in text:
        return Reply(text="thinking " * 40, latency=3.0, chunk_delay=0.1)
    return Reply(text=f"echo: {text}")


async def test_the_js_client_with_its_default_arguments(
    node: str, fake_llm: Any, start_worker: Any, lg_token: str
) -> None:
    """Every method the door serves, with the JS client's defaults (tests/node/defaults.mjs)."""
    fake_llm.responder = echo
    await asyncio.to_thread(start_worker)
    server = await asyncio.to_thread(DaphneProcess(TERRET_WORKER="celery").start)
    env = {**os.environ, "TERRET_LG_URL": f"{server.http}/lg", "TERRET_TOKEN": lg_token, "TERRET_PROFILE": PROFILE}
    try:
        done = await asyncio.to_thread(
            subprocess.run, [node, "defaults.mjs"], cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        server.kill()
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["assistant"] == PROFILE and out["created"] == "idle" and out["searched"]
    assert out["bound"] == PROFILE
    assert out["parts"][0] == "metadata" and "values" in out["parts"] and out["parts"][-1] == "end"
    assert "values" in out["replay"] and out["replay"][-1] == "end"
    assert out["joined"] == "echo: one" and out["runStatus"] == "success" and out["sameHead"]
    assert out["waited"] == "echo: two"
    assert out["listed"] == 3 and out["cancelled"] == "interrupted"
