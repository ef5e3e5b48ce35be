"""A program that knows only the public interface (HTTP API + session socket)
drives the whole life of a session: create it, chat, approve a call, change
the policy, cancel, compact, and read the title and cost.

Everything runs as in production: a real daphne process serves the API and
the socket, a real Celery worker process runs the turns, and the model is
FakeLLM speaking OpenAI SSE over HTTP. The test process only sets up a user,
a token and the demo profile, then talks HTTP and websocket. The embedded
variant drives the same program against the ASGI app in-process (SQLite,
in-memory layer, in-process worker).
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import httpx
import pytest
from channels.testing import WebsocketCommunicator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from terret_site.asgi import application
from tests.fakes.fake_llm import Reply
from tests.sessions_app.apiutil import demo, make_reviewer, token_for
from tests.sessions_app.liveserver import DaphneProcess
from tests.sessions_app.sockutil import db, fresh_channel_layer

pytestmark = pytest.mark.timeout(300)
_ = fresh_channel_layer  # an autouse fixture

COST = 0.001


def model(body: dict[str, Any]) -> Reply:
    """The fake provider: one behaviour per model spec and user request."""
    spec = body["model"]
    if spec == "fake/titler":
        return Reply(text="Greeting and notes", usage=(20, 4, COST))
    if spec == "fake/compactor":
        return Reply(text="The user greeted the agent and had notes.txt written.", usage=(200, 12, COST))
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Reply(text="Done with the file.", usage=(60, 6, COST))
    text = str(last.get("content") or "")
    if "write" in text:
        return Reply(tool_calls=[("workspace.write", {"path": "notes.txt", "content": "hello"})], usage=(50, 10, COST))
    if "slow" in text:
        # A step that wants another step after it, so the turn reaches a step
        # boundary (where a cancel takes effect) instead of simply finishing.
        return Reply(tool_calls=[("clock.now", {})], latency=4.0, usage=(40, 7, COST))
    return Reply(text="Hello! How can I help?", usage=(30, 8, COST))


class Watcher:
    """Reads the session socket in the background, as a program would."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.frames: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                self.frames.append(json.loads(raw))
                self.changed.set()
        except ConnectionClosed:
            self.changed.set()

    @property
    def events(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == "event"]

    async def wait(self, predicate: Any, after: int = 0, timeout: float = 60) -> dict[str, Any]:  # noqa: ASYNC109
        """The first frame after index `after` matching `predicate`."""
        async with asyncio.timeout(timeout):
            while True:
                for frame in self.frames[after:]:
                    if predicate(frame):
                        return frame
                self.changed.clear()
                await self.changed.wait()

    async def request(self, frame: dict[str, Any]) -> dict[str, Any]:
        mark = len(self.frames)
        await self.ws.send(json.dumps(frame))
        reply = await self.wait(lambda f: f["type"] in ("ack", "error") and f.get("id") == frame["id"], mark)
        assert reply["type"] == "ack", reply
        return reply

    async def turn_end(self, after_seq: int) -> dict[str, Any]:
        return await self.wait(lambda f: f.get("kind") == "turn/end" and f["seq"] > after_seq)


@pytest.fixture
def owner(make_user):
    demo()  # the admin-managed profile the program will ask for (a flush by an earlier test removes it)
    return make_reviewer(make_user("program-owner"))


@pytest.mark.worker
async def test_a_program_drives_a_session_from_start_to_finish(fake_llm, start_worker, owner):
    fake_llm.responder = model
    token = await db(token_for)(owner)
    await asyncio.to_thread(start_worker)
    server = await asyncio.to_thread(DaphneProcess(TERRET_WORKER="celery").start)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(base_url=f"{server.http}/api", headers=headers, timeout=30) as api:
            await drive(api, lambda sid: connect(f"{server.ws}/ws/sessions/{sid}/?token={token}"))
    finally:
        server.kill()


class CommunicatorSocket:
    """The websockets-client surface drive() uses, over an in-process
    WebsocketCommunicator (embedded mode has no server process)."""

    def __init__(self, path: str) -> None:
        self.comm = WebsocketCommunicator(application, path)

    async def __aenter__(self) -> CommunicatorSocket:
        connected, _ = await self.comm.connect(timeout=10)
        assert connected
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.comm.disconnect(timeout=5)

    async def send(self, text: str) -> None:
        await self.comm.send_to(text_data=text)

    def __aiter__(self) -> CommunicatorSocket:
        return self

    async def __anext__(self) -> str:
        output = await self.comm.receive_output(timeout=600)
        if output["type"] == "websocket.close":
            raise StopAsyncIteration
        return str(output["text"])


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
async def test_the_same_program_in_embedded_mode(fake_llm, owner, settings):
    """SQLite, the in-memory channel layer and the in-process worker: the
    interface behaves the same when Terret runs as one process."""
    settings.TERRET_WORKER = "inprocess"
    fake_llm.responder = model
    token = await db(token_for)(owner)
    transport = httpx.ASGITransport(app=application)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost/api", headers=headers) as api:
        await drive(api, lambda sid: CommunicatorSocket(f"/ws/sessions/{sid}/?token={token}"))


async def drive(api: httpx.AsyncClient, open_socket: Any) -> None:
    profiles = (await api.get("/profiles")).json()["profiles"]
    assert "demo" in [p["name"] for p in profiles]
    created = await api.post("/sessions", json={"profile": "demo"})
    assert created.status_code == 201
    sid = created.json()["id"]

    async with open_socket(sid) as ws:
        watch = Watcher(ws)
        await watch.wait(lambda f: f["type"] == "synced")
        for n, role in enumerate(("main", "titler", "compactor")):
            await watch.request({"type": "set_model", "id": f"model-{n}", "role": role, "spec": f"fake/{role}"})

        # Chat: the socket's inject opens a turn; the worker answers.
        ack = await watch.request({"type": "inject", "id": "chat", "text": "hello there", "wake": True})
        assert ack["receipt"]["disposition"] == "started"
        end = await watch.turn_end(ack["receipt"]["turn_seq"])
        assert end["data"]["status"] == "completed"
        reply = await watch.wait(lambda f: f.get("kind") == "assistant/message")
        assert reply["data"]["content"] == "Hello! How can I help?"

        # A mutating tool call parks for approval; the program approves it.
        receipt = (await api.post(f"/sessions/{sid}/inputs", json={"text": "please write notes"})).json()
        assert receipt["disposition"] == "started"
        asked = await watch.wait(lambda f: f.get("kind") == "approval/requested" and f["seq"] > receipt["seq"])
        detail = (await api.get(f"/sessions/{sid}")).json()
        assert detail["status"] == "waiting_approval"
        assert [p["call_id"] for p in detail["pending_approvals"]] == [asked["data"]["call_id"]]
        await watch.request({"type": "approve", "id": "ok", "call_id": asked["data"]["call_id"], "reason": "fine"})
        end = await watch.turn_end(receipt["turn_seq"])
        assert end["data"]["status"] == "completed"
        result = await watch.wait(lambda f: f.get("kind") == "tool/result" and f["seq"] > asked["seq"])
        assert not result["data"].get("is_error"), result
        # What it wrote is the session's document, whichever process ran the tool.
        listed = (await api.get(f"/sessions/{sid}/documents")).json()["documents"]
        assert [(d["name"], d["version"], d["size"]) for d in listed] == [("notes.txt", 1, 5)]
        doc = (await api.get(f"/sessions/{sid}/documents/notes.txt")).json()
        assert (doc["content"], doc["encoding"]) == ("hello", "utf-8")

        # Narrow the policy: the same request is now refused by the allow-list.
        policy = await api.put(f"/sessions/{sid}/policy", json={"patterns": ["clock.*"]})
        assert policy.status_code == 200
        receipt = (await api.post(f"/sessions/{sid}/inputs", json={"text": "write it again"})).json()
        refused = await watch.wait(lambda f: f.get("kind") == "tool/result" and f["seq"] > receipt["seq"])
        assert refused["data"]["is_error"] and "not allowed" in refused["data"]["content"]
        await watch.turn_end(receipt["turn_seq"])

        # Cancel a turn while its model call is still running.
        receipt = (await api.post(f"/sessions/{sid}/inputs", json={"text": "a slow answer please"})).json()
        await watch.wait(lambda f: f.get("kind") == "step/start" and f["seq"] > receipt["seq"])
        # A worker holds the turn, so the cancel reaches it mid-stream (closed: False).
        assert (await api.post(f"/sessions/{sid}/cancel")).json() == {"cancelled": True, "closed": False}
        end = await watch.turn_end(receipt["turn_seq"])
        assert end["data"]["status"] == "cancelled"

        # Compact between turns.
        compacted = (await api.post(f"/sessions/{sid}/compact")).json()
        assert compacted["compacted"] is True, compacted
        await watch.wait(lambda f: f.get("kind") == "session/compacted")

        # Title and cost, as the API reports them, agree with the log.
        detail = (await api.get(f"/sessions/{sid}")).json()
        assert detail["title"] == "Greeting and notes"
        assert detail["status"] == "idle" and detail["pending_approvals"] == []
        events = await all_events(api, sid)
        assert [e["seq"] for e in events] == list(range(1, detail["last_seq"] + 1))
        spent = sum(
            (
                Decimal(str(e["data"]["usage"].get("cost") or 0))
                for e in events
                if "usage" in e["data"] and e["kind"] != "assistant/message"
            ),
            Decimal(0),
        )
        assert detail["usage"]["cost"] == pytest.approx(float(spent))
        assert detail["usage"]["cost"] >= 6 * COST  # 4 answered steps at least, the title and the summary
        assert detail["usage"]["steps"] >= 5
        # The socket saw exactly the log: every event once, in order.
        assert [f["seq"] for f in watch.events] == [e["seq"] for e in events][: len(watch.events)]
        watch.task.cancel()


async def all_events(api: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        page = (await api.get(f"/sessions/{sid}/events", params={"after": events[-1]["seq"] if events else 0})).json()
        events += page["events"]
        if not page["events"] or events[-1]["seq"] >= page["last_seq"]:
            return events
