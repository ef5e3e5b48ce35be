"""multitask_strategy through the real langgraph-sdk on a live daphne and a
real Celery worker: enqueue (a pending run named by its input, which runs
after the busy one and streams from its own start), cancel of a pending run
(its input is withdrawn and never reaches the model), interrupt (the busy
run ends interrupted, the new one runs), and on_disconnect=cancel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph_sdk import get_client

from sessions_app.models import Event
from tests.fakes.fake_llm import Reply
from tests.sessions_app.lg.conftest import PROFILE
from tests.sessions_app.liveserver import DaphneProcess
from tests.sessions_app.sockutil import db

pytestmark = [pytest.mark.worker, pytest.mark.timeout(240)]


def model(body: dict[str, Any]) -> Reply:
    text = str(body["messages"][-1].get("content") or "")
    if text.startswith("slow"):
        return Reply(text="still thinking " * 20, latency=3.0, chunk_delay=0.1)
    return Reply(text=f"answer to {text}")


def asked(fake_llm: Any) -> list[str]:
    """The last user text of every request the model server received."""
    out = []
    for request in fake_llm.requests:
        users = [m for m in request["messages"] if m["role"] == "user"]
        out.append(str(users[-1]["content"]) if users else "")
    return out


async def until(predicate: Any, timeout: float = 30.0) -> None:  # noqa: ASYNC109
    """Poll the server (another process: no event to wait on)."""
    async with asyncio.timeout(timeout):
        while not await predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.2)


def user_says(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def test_enqueue_interrupt_and_disconnect(fake_llm: Any, start_worker: Any, lg_token: str) -> None:
    fake_llm.responder = model
    await asyncio.to_thread(start_worker)
    server = await asyncio.to_thread(DaphneProcess(TERRET_WORKER="celery").start)
    client = get_client(url=f"{server.http}/lg", api_key=lg_token)
    try:
        tid = (await client.threads.create(metadata={"graph_id": PROFILE}))["thread_id"]
        await lanes(client, tid, fake_llm)
    finally:
        await client.aclose()
        server.kill()


async def lanes(client: Any, tid: str, fake_llm: Any) -> None:
    status = lambda rid: _status(client, tid, rid)  # noqa: E731

    # enqueue: pending while the busy run runs, then a run of its own
    busy = await client.runs.create(tid, PROFILE, input=user_says("slow one"))
    queued = await client.runs.create(tid, PROFILE, input=user_says("second"), multitask_strategy="enqueue")
    assert queued["status"] == "pending" and queued["run_id"] != busy["run_id"]
    dropped = await client.runs.create(tid, PROFILE, input=user_says("never"), multitask_strategy="enqueue")
    await client.runs.cancel(tid, dropped["run_id"])  # a pending run: its input is withdrawn
    assert (await client.runs.get(tid, dropped["run_id"]))["status"] == "interrupted"
    parts = [p async for p in client.runs.join_stream(tid, queued["run_id"], stream_mode=["values"])]
    values = [p.data for p in parts if p.event == "values"]
    assert values[-1]["messages"][-1]["content"] == "answer to second"
    assert values[0]["messages"][-1]["content"] == "second", "the run's stream starts at its own input"
    assert await status(busy["run_id"]) == "success" and await status(queued["run_id"]) == "success"
    assert asked(fake_llm) == ["slow one", "second"], "the withdrawn input never reached the model"

    # interrupt: the busy run is cancelled, the new input runs
    busy = await client.runs.create(tid, PROFILE, input=user_says("slow two"))
    await until(lambda: _model_asked(fake_llm, "slow two"))
    cutting = await client.runs.create(tid, PROFILE, input=user_says("third"), multitask_strategy="interrupt")
    await client.runs.join(tid, cutting["run_id"])
    assert await status(busy["run_id"]) == "interrupted"
    assert await status(cutting["run_id"]) == "success"
    ends = await db(
        lambda: list(Event.objects.filter(session_id=tid, kind="turn/end").values_list("data", flat=True))
    )()
    assert [e["status"] for e in ends][-2:] == ["cancelled", "completed"]

    # wait: the thread's values once the run has ended
    values = await client.runs.wait(tid, PROFILE, input=user_says("fourth"))
    assert values["messages"][-1] == {**values["messages"][-1], "type": "ai", "content": "answer to fourth"}
    assert [t["thread_id"] for t in await client.threads.search(status="idle")] == [tid]

    # on_disconnect=cancel: a client that goes away mid-run takes the run with it
    stream = client.runs.stream(tid, PROFILE, input=user_says("slow three"), on_disconnect="cancel")
    first = await anext(stream)
    assert first.event == "metadata"
    run_id = first.data["run_id"]
    await stream.aclose()
    await until(lambda: _is(client, tid, run_id, "interrupted"))
    assert (await client.threads.get(tid))["status"] == "idle"


async def _status(client: Any, tid: str, run_id: str) -> str:
    return str((await client.runs.get(tid, run_id))["status"])


async def _is(client: Any, tid: str, run_id: str, wanted: str) -> bool:
    return await _status(client, tid, run_id) == wanted


async def _model_asked(fake_llm: Any, text: str) -> bool:
    return text in asked(fake_llm)
