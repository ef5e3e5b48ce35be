"""langgraph-sdk (Python) with its default arguments, for every method the
door serves, against a live daphne and a real Celery worker (PostgreSQL,
Redis, FakeLLM): whatever the SDK sends for a parameter left at its default
(`stream_mode=` empty on join_stream, `wait=false`, `limit=10`, no metadata)
means what the LangGraph server takes it to mean."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph_sdk import get_client

from tests.fakes.fake_llm import Reply
from tests.sessions_app.lg.conftest import PROFILE
from tests.sessions_app.liveserver import DaphneProcess

pytestmark = [pytest.mark.worker, pytest.mark.timeout(180)]


def model(body: dict[str, Any]) -> Reply:
    text = str(body["messages"][-1].get("content") or "")
    if "slow" in text:
        return Reply(text="thinking " * 40, latency=3.0, chunk_delay=0.1)
    return Reply(text=f"echo: {text}", chunk_delay=0.01)


def said(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def test_every_method_with_the_sdks_defaults(fake_llm: Any, start_worker: Any, lg_token: str) -> None:
    fake_llm.responder = model
    await asyncio.to_thread(start_worker)
    server = await asyncio.to_thread(DaphneProcess(TERRET_WORKER="celery").start)
    client = get_client(url=f"{server.http}/lg", api_key=lg_token)
    try:
        await with_defaults(client)
    finally:
        await client.aclose()
        server.kill()


async def with_defaults(client: Any) -> None:
    assistant = next(a for a in await client.assistants.search() if a["graph_id"] == PROFILE)
    assert (await client.assistants.get(assistant["assistant_id"]))["graph_id"] == PROFILE

    thread = await client.threads.create()  # no metadata: its first run binds it
    tid = thread["thread_id"]
    assert (await client.threads.get(tid))["status"] == "idle"
    assert [t["thread_id"] for t in await client.threads.search()] == [tid]

    parts = [p async for p in client.runs.stream(tid, PROFILE, input=said("one"))]
    assert parts[0].event == "metadata" and parts[-1].event == "end"
    run_id = parts[0].data["run_id"]
    values = [p.data for p in parts if p.event == "values"]
    assert values[-1]["messages"][-1]["content"] == "echo: one"
    assert (await client.threads.get(tid))["metadata"]["graph_id"] == PROFILE

    # join_stream with its defaults (stream_mode= empty, no Last-Event-ID) replays the run.
    replay = [p async for p in client.runs.join_stream(tid, run_id)]
    assert [p.data for p in replay if p.event == "values"] == values
    assert replay[-1].event == "end"
    assert (await client.runs.join(tid, run_id))["messages"][-1]["content"] == "echo: one"
    assert (await client.runs.get(tid, run_id))["status"] == "success"

    state = await client.threads.get_state(tid)
    history = await client.threads.get_history(tid)
    assert history[0]["checkpoint"] == state["checkpoint"]
    assert 1 <= len(history) <= 10

    waited = await client.runs.wait(tid, PROFILE, input=said("two"))
    assert waited["messages"][-1]["content"] == "echo: two"

    created = await client.runs.create(tid, PROFILE, input=said("slow, please"))
    assert created["status"] == "running"
    listed = await client.runs.list(tid)
    assert [r["run_id"] for r in listed][0] == created["run_id"] and len(listed) == 3
    await client.runs.cancel(tid, created["run_id"])
    await client.runs.join(tid, created["run_id"])
    assert (await client.runs.get(tid, created["run_id"]))["status"] == "interrupted"
    assert (await client.threads.get(tid))["status"] == "idle"
