"""The real langgraph-sdk (0.4.14) drives Terret through /lg/ on a live daphne,
with a real Celery worker on PostgreSQL + Redis and FakeLLM as the provider:
create a thread; stream values, messages-tuple, updates (and custom: every
committed event) with stream_resumable; daphne is killed and restarted
mid-run and the SDK's own reconnect finishes the stream with no gap and no
duplicate; the approval interrupt in HITL shape; get_state's next and tasks;
join_stream(last_event_id=...); resume with a decision; history; a 409 under
reject; cancel.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError

from sessions_app.models import Event
from tests.fakes.fake_llm import Reply
from tests.helpers import document_text
from tests.sessions_app.lg.conftest import PROFILE
from tests.sessions_app.liveserver import DaphneProcess
from tests.sessions_app.sockutil import db

pytestmark = [pytest.mark.worker, pytest.mark.timeout(240)]

MODES = ["values", "messages-tuple", "updates", "custom"]
EDITED = {"name": "workspace.write", "arguments": {"path": "notes.txt", "content": "edited by a reviewer"}}


def model(body: dict[str, Any]) -> Reply:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Reply(text="The file is written.", latency=1.0, chunk_delay=0.1, usage=(60, 6, 0.001))
    text = str(last.get("content") or "")
    if "slow" in text:
        return Reply(text="thinking " * 30, latency=6.0, chunk_delay=0.1)
    # Slow enough that daphne's restart lands mid-run.
    return Reply(
        text="I will write notes.txt now.",
        tool_calls=[("workspace.write", {"path": "notes.txt", "content": "hello"})],
        latency=2.5,
        chunk_delay=0.2,
        usage=(50, 10, 0.001),
    )


def is_delta(part: Any) -> bool:
    """A live token delta (a committed message streamed as deltas comes as the
    chunk that completes them, with its seq)."""
    chunk = part.data[0] if part.event == "messages" else {}
    return chunk.get("type") == "AIMessageChunk" and "seq" not in chunk["response_metadata"]


def committed(parts: list[Any]) -> list[tuple[str, str, Any]]:
    """(id, event, data) of the frames made from committed events. A committed
    AI message in messages-tuple depends on the connection (whole, or the chunk
    completing the deltas that connection streamed), so it is compared by its
    id, seq and tool calls; its text is checked in full by `values`."""
    return [
        (p.id, p.event, as_committed(p))
        for p in parts
        if p.id is not None and p.event not in ("metadata", "end") and not is_delta(p)
    ]


def as_committed(part: Any) -> Any:
    message = part.data[0] if part.event == "messages" else {}
    if message.get("type") not in ("ai", "AIMessageChunk"):
        return part.data
    calls = [(c["name"], c["args"]) for c in message["tool_calls"]]
    return ["ai", message["id"], message["response_metadata"]["seq"], calls, part.data[1]]


def unique_ids(parts: list[Any]) -> list[str]:
    """The ids as the client saw them change (the SSE decoder carries the last id onto id-less frames)."""
    seen: list[str] = []
    for p in parts:
        if p.id is not None and not is_delta(p) and (not seen or seen[-1] != p.id):
            seen.append(p.id)
    return seen


async def test_langgraph_sdk_drives_a_thread_through_a_restart(
    fake_llm: Any, start_worker: Any, lg_token: str, settings: Any, tmp_path: Path
) -> None:
    fake_llm.responder = model
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    await asyncio.to_thread(start_worker)
    servers = [await asyncio.to_thread(DaphneProcess(TERRET_WORKER="celery").start)]
    client = get_client(url=f"{servers[0].http}/lg", api_key=lg_token)
    try:
        await scenario(client, servers, fake_llm, tmp_path)
    finally:
        await client.aclose()
        for server in servers:
            server.kill()


async def scenario(client: Any, servers: list[DaphneProcess], fake_llm: Any, workspace: Path) -> None:
    info = await client.http.get("/info")
    assert info["flags"]["assistants"] is True
    assistants = await client.assistants.search(graph_id=PROFILE)
    assert [a["graph_id"] for a in assistants] == [PROFILE]
    assistant_id = assistants[0]["assistant_id"]

    # 1. create a thread
    thread = await client.threads.create(metadata={"graph_id": PROFILE, "ignored": "by design"})
    tid = thread["thread_id"]
    assert thread["status"] == "idle"
    assert (await client.threads.get(tid))["thread_id"] == tid
    assert [t["thread_id"] for t in await client.threads.search(limit=5)] == [tid]

    # 2 + 4. stream with stream_resumable; daphne dies and comes back mid-run
    created: list[Any] = []
    parts: list[Any] = []
    restarted = False
    async for part in client.runs.stream(
        tid,
        assistant_id,
        input={"messages": [{"role": "user", "content": "please write notes.txt"}]},
        stream_mode=MODES,
        stream_resumable=True,
        on_run_created=created.append,
    ):
        parts.append(part)
        if not restarted and part.event == "values":
            restarted = True
            await asyncio.to_thread(servers[0].kill)  # SIGKILL: the stream is cut, no goodbye
            answered = await db(lambda: Event.objects.filter(session_id=tid, kind="assistant/message").count())()
            assert answered == 0, "the model had not answered yet: the rest of the run came after the restart"
            servers.append(DaphneProcess(port=servers[0].port, TERRET_WORKER="celery"))
            await asyncio.to_thread(servers[-1].start)
    assert restarted
    run_id = created[0]["run_id"]
    assert created[0]["thread_id"] == tid
    assert parts[0].event == "metadata" and parts[0].data["run_id"] == run_id
    assert [p.event for p in parts].count("metadata") == 1, "a resumed stream sends no second metadata"

    # The whole run read again from the log is the reference: the reconnected
    # stream has every committed frame exactly once, in order.
    reference = [p async for p in client.runs.join_stream(tid, run_id, stream_mode=MODES)]
    assert committed(parts) == committed(reference)
    ids = unique_ids(parts)
    assert len(ids) == len(set(ids))
    seqs = [p.data["seq"] for p in parts if p.event == "custom"]
    assert seqs == list(range(seqs[0], seqs[-1] + 1)), "every committed event of the run, no gap"
    modes_seen = {p.event for p in parts}
    assert {"values", "messages", "updates", "custom", "end"} <= modes_seen

    # messages-tuple: the AI message with its tool call, and metadata
    # A committed AI frame is the whole message ("ai"), or, to a connection that
    # already streamed its deltas, the chunk completing them ("AIMessageChunk"):
    # which one depends on when the restart cut the stream.
    ai = [
        p.data
        for p in parts
        if p.event == "messages" and p.id is not None and p.data[0]["type"] in ("ai", "AIMessageChunk")
    ]
    assert ai[-1][0]["tool_calls"][0]["name"] == "workspace.write"
    assert ai[-1][1]["langgraph_node"] == "agent"

    # 3. the approval interrupt, in HumanInTheLoopMiddleware's shape
    final_values = [p.data for p in parts if p.event == "values"][-1]
    (interrupt,) = final_values["__interrupt__"]
    assert interrupt["value"]["action_requests"][0]["name"] == "workspace.write"
    assert interrupt["value"]["action_requests"][0]["arguments"] == {"path": "notes.txt", "content": "hello"}
    assert interrupt["value"]["review_configs"][0]["action_name"] == "workspace.write"
    updates = [p.data for p in parts if p.event == "updates"]
    assert updates[-1] == {"__interrupt__": [interrupt]}

    state = await client.threads.get_state(tid)
    assert state["next"] == ["tools"]
    assert state["tasks"][0]["interrupts"] == [interrupt]
    assert state["interrupts"] == [interrupt]
    assert (await client.threads.get(tid))["status"] == "interrupted"
    run = await client.runs.get(tid, run_id)
    assert run["status"] == "interrupted"
    assert await db(lambda: document_text(tid, "notes.txt"))() is None, "nothing ran before the decision"

    # 5. join_stream from a Last-Event-ID: exactly what came after it
    # A sub-frame id ("N.k": a frame before the last one made from event N) if there is one.
    ids_seen = [c[0] for c in committed(reference)]
    middle = next((i for i in ids_seen[len(ids_seen) // 2 :] if "." in i), ids_seen[len(ids_seen) // 2])
    rest = [p async for p in client.runs.join_stream(tid, run_id, stream_mode=MODES, last_event_id=middle)]
    after = committed(reference)
    index = [i for i, c in enumerate(after) if c[0] == middle][-1]
    assert committed(rest) == after[index + 1 :]
    assert rest[0].event != "metadata"

    # 6. resume with a decision (an edit: approve with other arguments)
    requests_before = len(fake_llm.requests)
    resumed = [
        p
        async for p in client.runs.stream(
            tid,
            assistant_id,
            command={"resume": {"decisions": [{"type": "edit", "edited_action": EDITED}]}},
            stream_mode=["values", "updates", "messages-tuple"],
        )
    ]
    deltas = [i for i, p in enumerate(resumed) if is_delta(p)]
    assert "".join(resumed[i].data[0]["content"] for i in deltas) == "The file is written."
    # Live only: a delta carries no id of its own (the decoder keeps the last one).
    assert all(resumed[i].id == resumed[i - 1].id for i in deltas)
    # The committed reply completes the deltas; its text is not sent again (F4).
    completing = [
        p.data[0] for p in resumed if p.event == "messages" and p.data[0]["id"] == resumed[deltas[0]].data[0]["id"]
    ]
    assert completing[-1]["type"] == "AIMessageChunk" and completing[-1]["content"] == ""
    assert completing[-1]["response_metadata"]["seq"] > 0
    last_values = [p.data for p in resumed if p.event == "values"][-1]
    assert last_values["messages"][-1]["content"] == "The file is written."
    assert [m["type"] for m in last_values["messages"]] == ["human", "ai", "tool", "ai"]
    assert resumed[-1].event == "end"
    # The edit is what ran, and what the AI message's tool call now shows.
    assert await db(lambda: document_text(tid, "notes.txt"))() == "edited by a reviewer"
    assert last_values["messages"][1]["tool_calls"][0]["args"] == EDITED["arguments"]
    assert len(fake_llm.requests) == requests_before + 1
    assert (await client.threads.get(tid))["status"] == "idle"
    runs = await client.runs.list(tid)
    assert [r["status"] for r in runs] == ["success", "interrupted"]

    # 7. history: newest first, the parked checkpoint among them
    history = await client.threads.get_history(tid, limit=20)
    assert history[0]["values"]["messages"][-1]["content"] == "The file is written."
    assert history[0]["next"] == []
    assert any(h["next"] == ["tools"] and h["tasks"][0]["interrupts"] for h in history)
    ids_desc = [int(h["checkpoint"]["checkpoint_id"][4:]) for h in history]
    assert ids_desc == sorted(ids_desc, reverse=True)
    older = await client.threads.get_state(tid, checkpoint_id=history[-1]["checkpoint"]["checkpoint_id"])
    assert older["values"] == history[-1]["values"]

    # 8. a second run under reject while one runs: 409, and nothing appended
    slow = await client.runs.create(tid, assistant_id, input={"messages": [{"role": "user", "content": "slow please"}]})
    assert slow["status"] == "running"
    with pytest.raises(ConflictError) as refused:
        await client.runs.create(
            tid, assistant_id, input={"messages": [{"role": "user", "content": "again"}]}, multitask_strategy="reject"
        )
    assert refused.value.response.status_code == 409
    assert json.loads(refused.value.response.text)["code"] == "turn_already_running"
    inputs = await db(lambda: list(Event.objects.filter(session_id=tid, data__text="again").values_list("kind")))()
    assert inputs == [], "the refused input was not appended"

    # 9. cancel: the slow run ends interrupted, and the thread is idle again
    await client.runs.cancel(tid, slow["run_id"])
    await client.runs.join(tid, slow["run_id"])
    assert (await client.runs.get(tid, slow["run_id"]))["status"] == "interrupted"
    assert (await client.threads.get(tid))["status"] == "idle"
    ends = await db(
        lambda: list(Event.objects.filter(session_id=tid, kind="turn/end").values_list("data", flat=True))
    )()
    assert [e["status"] for e in ends] == ["completed", "cancelled"]
    with pytest.raises(httpx.HTTPStatusError) as ended:
        await client.runs.cancel(tid, slow["run_id"])
    assert ended.value.response.status_code == 409

    # A run from an earlier checkpoint runs in a fork: a new thread, this one untouched
    first_end = await db(lambda: Event.objects.filter(session_id=tid, kind="turn/end").order_by("seq").first().seq)()
    head = await db(lambda: Event.objects.filter(session_id=tid).count())()
    forked = await client.runs.create(
        tid,
        assistant_id,
        input={"messages": [{"role": "user", "content": "hi from the fork"}]},
        checkpoint_id=f"seq-{first_end}",
    )
    assert forked["thread_id"] != tid
    fork_state = await client.threads.get_state(forked["thread_id"])
    texts = [m["content"] for m in fork_state["values"]["messages"] if m["type"] == "human"]
    assert texts[0] == "please write notes.txt" and texts[-1] == "hi from the fork"
    assert "slow please" not in texts, "the fork holds the history as of its checkpoint only"
    assert await db(lambda: Event.objects.filter(session_id=tid).count())() == head + 1  # session/forked_to
