"""server-everything's tools as Terret tools in real turns: a real Celery
worker, the fake model server, and a socket client on the session stream.

- a long-running call's progress notifications reach the socket as `live`
  frames (tool/progress) while the call runs, and never enter the log;
- an image a tool returns is stored with its result and reaches the next
  model request as an image part when the profile says the main role takes
  images (counted at the fake model server), and only as a text line when not;
- over Streamable HTTP, the bearer token reaches the server and appears in
  no event.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for
from tests.sessions_app.apiutil import token_for
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket, recv_until, synced
from tests.sessions_app.tools.conftest import AuthProxy, http_config

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]
_ = fresh_channel_layer  # an autouse fixture

LONG = "mcp.everything.trigger-long-running-operation"
IMAGE = "mcp.everything.get-tiny-image"


def session_for(make_user: Any, server: dict[str, Any], image_roles: list[str]) -> tuple[Session, str]:
    owner = make_user()
    profile = AgentProfile.objects.create(
        name=f"everything-{len(image_roles)}-{server['name']}",
        roles={"main": "test/model"},
        mcp_servers=[server],
        image_roles=image_roles,
        allow_floor=["*"],
    )
    return services.create_session(owner, profile), token_for(owner)


def image_parts(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        part
        for message in request["messages"]
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


async def test_progress_reaches_the_socket_and_the_image_reaches_the_model(
    start_worker: Callable[..., Any], fake_llm: Any, make_user: Any, everything_stdio: dict[str, Any]
) -> None:
    fake_llm.script(
        Reply(tool_calls=[(LONG, {"duration": 1.5, "steps": 3})]),
        Reply(tool_calls=[(IMAGE, {})]),
        Reply(text="done"),
    )
    session, token = await db(session_for)(make_user, everything_stdio, ["main"])
    await db(start_worker)()
    comm = await open_socket(f"/ws/sessions/{session.id}/?token={token}")
    await synced(comm)
    await db(services.inject)(session.id, "show me", wake=True)

    frames = await recv_until(comm, lambda f: f["type"] == "live" and f.get("progress") == 3, timeout=60)
    live = [f for f in frames if f["type"] == "live"]
    (call,) = [e for e in frames if e["type"] == "event" and e["kind"] == "assistant/message"][0]["data"]["tool_calls"]
    assert {f["kind"] for f in live} == {"tool/progress"} and {f["call_id"] for f in live} == {call["id"]}
    assert [(f["progress"], f["total"]) for f in live] == [(1, 3), (2, 3), (3, 3)]
    # The progress came while the call ran: its result was not committed yet.
    assert not [e for e in frames if e["type"] == "event" and e["kind"] == "tool/result"]
    await recv_until(comm, lambda f: f["type"] == "event" and f["kind"] == "turn/end", timeout=60)

    kinds = await db(lambda: set(Event.objects.filter(session=session).values_list("kind", flat=True)))()
    assert "tool/progress" not in kinds  # a hint, never a log event
    results = await db(events)(session, "tool/result")
    assert not any(r["is_error"] for r in results)
    (image,) = results[1]["attachments"]
    assert image["mime_type"] == "image/png" and "[image 1: image/png" in results[1]["content"]

    requests = fake_llm.requests
    assert len(requests) == 3
    assert [len(image_parts(r)) for r in requests] == [0, 0, 1]  # only the request after the image
    (part,) = image_parts(requests[2])
    assert part["image_url"]["url"] == f"data:image/png;base64,{image['data']}"
    # Wire order: the tool result, then the user message carrying its image.
    roles = [m["role"] for m in requests[2]["messages"]]
    assert roles[-2:] == ["tool", "user"]


def test_a_text_only_model_reads_a_description_of_the_image(
    start_worker: Callable[..., Any], fake_llm: Any, make_user: Any, everything_stdio: dict[str, Any]
) -> None:
    fake_llm.script(Reply(tool_calls=[(IMAGE, {})]), Reply(text="seen"))
    session, _ = session_for(make_user, everything_stdio, [])
    start_worker()
    services.inject(session.id, "show me", wake=True)
    wait_for(lambda: events(session, "turn/end"), timeout=60, what="turn/end")
    assert events(session, "turn/end")[0]["status"] == "completed"
    requests = fake_llm.requests
    assert len(requests) == 2 and [len(image_parts(r)) for r in requests] == [0, 0]
    (tool,) = tool_messages(requests[1])
    assert "[image 1: image/png" in tool["content"] and "this model takes text only" in tool["content"]
    assert "attachments" not in tool and "images" not in tool


def test_a_remote_server_runs_tools_with_the_token_from_the_environment(
    start_worker: Callable[..., Any], fake_llm: Any, make_user: Any, auth_proxy: AuthProxy
) -> None:
    server = http_config(auth_proxy, name="everything")
    fake_llm.script(Reply(tool_calls=[("mcp.everything.echo", {"message": "over http"})]), Reply(text="ok"))
    session, _ = session_for(make_user, server, [])
    start_worker()  # worker_env copies this process's environment, the token's variable included
    services.inject(session.id, "echo", wake=True)
    wait_for(lambda: events(session, "turn/end"), timeout=60, what="turn/end")
    (result,) = events(session, "tool/result")
    assert (result["content"], result["is_error"]) == ("Echo: over http", False)
    assert auth_proxy.seen and set(auth_proxy.seen) == {f"Bearer {auth_proxy.token}"}
    log = json.dumps(list(Event.objects.filter(session=session).values_list("data", flat=True)))
    assert auth_proxy.token not in log
