"""The door as its real clients call it (issue 28): agent-chat-ui's and the
SDKs' requests, with Django's test client; turns run through the real loop
against FakeLLM, driven synchronously (TERRET_WORKER=manual).

F1 the head a client read is no fork; F2 interrupts carry `args`; F3 a
command with an empty input; F4 message frames before values, no reply
resent whole; F5 typing at an interrupt; F6 a thread without a graph id
takes its first run's assistant; F7 regenerate; L3 a refused fork request
creates nothing; L6 a foreign thread id answers as a missing one.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.test import Client

from sessions_app.lg import mapping, stream
from sessions_app.log.records import LoggedEvent
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.drive import drive
from sessions_app.services import sessions as session_services
from tests.fakes.fake_llm import Reply
from tests.helpers import document_text
from tests.sessions_app.apiutil import token_for
from tests.sessions_app.lg.conftest import PROFILE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


def post(client: Client, url: str, body: Any, token: str) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json", HTTP_X_API_KEY=token)


def new_thread(client: Client, token: str, metadata: dict[str, Any] | None = None) -> str:
    body = {"metadata": {"graph_id": PROFILE}} if metadata is None else {"metadata": metadata}
    return str(post(client, "/lg/threads", body, token).json()["thread_id"])


def run(client: Client, token: str, thread: str, body: dict[str, Any]) -> Any:
    return post(client, f"/lg/threads/{thread}/runs", {"assistant_id": PROFILE, **body}, token)


def say(text: str) -> dict[str, Any]:
    """agent-chat-ui's input: a human message with text parts."""
    return {"messages": [{"id": str(uuid.uuid4()), "type": "human", "content": [{"type": "text", "text": text}]}]}


def turn(client: Client, token: str, thread: str, fake: Any, text: str, *replies: Reply, **body: Any) -> Any:
    fake.script(*replies)
    answer = run(client, token, thread, {"input": say(text), **body})
    assert answer.status_code == 200, answer.json()
    drive(answer.json()["thread_id"])
    return answer


def head_checkpoint(client: Client, token: str, thread: str) -> dict[str, Any]:
    return dict(client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=token).json()["checkpoint"])


def write_call(path: str = "a.txt", content: str = "x") -> Reply:
    return Reply(tool_calls=[("workspace.write", {"path": path, "content": content})])


def test_the_head_a_client_read_stays_the_head_after_titles(client: Client, lg_token: str, fake_llm: Any) -> None:
    """F1: events after the turn that make no history (a title) do not make the
    checkpoint the UI read look old: its next message stays in the thread."""
    thread = new_thread(client, lg_token)
    turn(client, lg_token, thread, fake_llm, "hello", Reply(text="hi there"))
    session_services.rename_session(thread, "A title", by="test")
    read = head_checkpoint(client, lg_token, thread)
    history = post(client, f"/lg/threads/{thread}/history", {"limit": 10}, lg_token).json()
    assert history[0]["checkpoint"] == read, "/state and /history[0] name the same head"
    assert mapping.parse_checkpoint_id(read["checkpoint_id"]) < Session.objects.get(id=thread).last_seq
    sessions = Session.objects.count()
    answer = turn(client, lg_token, thread, fake_llm, "again", Reply(text="once more"), checkpoint=read)
    assert answer.json()["thread_id"] == thread
    assert answer["Content-Location"].startswith(f"/threads/{thread}/runs/")
    assert Session.objects.count() == sessions, "no fork"
    values = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=lg_token).json()["values"]
    assert [m["content"] for m in values["messages"]] == ["hello", "hi there", "again", "once more"]


def test_an_interrupt_names_its_arguments_args(client: Client, lg_token: str, fake_llm: Any) -> None:
    """F2: langchain >= 1.0's ActionRequest has `args`; `arguments` stays as an alias."""
    thread = new_thread(client, lg_token)
    turn(client, lg_token, thread, fake_llm, "write", write_call("a.txt", "hi"))
    (interrupt,) = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=lg_token).json()["interrupts"]
    (action,) = interrupt["value"]["action_requests"]
    assert action["name"] == "workspace.write"
    assert action["args"] == action["arguments"] == {"path": "a.txt", "content": "hi"}


def test_a_command_beside_an_empty_input_wins(
    client: Client, lg_token: str, fake_llm: Any, settings: Any, tmp_path: Any
) -> None:
    """F3: agent-chat-ui's Approve sends {"input": {}, "command": {"resume": ...}}
    with the head checkpoint it read."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    thread = new_thread(client, lg_token)
    turn(client, lg_token, thread, fake_llm, "write", write_call("a.txt", "hi"))
    read = head_checkpoint(client, lg_token, thread)
    both = {"input": say("and this"), "command": {"resume": {"decisions": [{"type": "approve"}]}}}
    refused = run(client, lg_token, thread, both)
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_input"
    fake_llm.script(Reply(text="written"))
    resume = {"input": {}, "command": {"resume": {"decisions": [{"type": "approve"}]}}, "checkpoint": read}
    answer = run(client, lg_token, thread, resume)
    assert answer.status_code == 200, answer.json()
    assert drive(thread) == "ended"
    assert document_text(thread, "a.txt") == "hi"
    assert Event.objects.filter(session_id=thread, kind="approval/resolved", data__verdict="approve").count() == 1


def test_an_owner_who_may_not_decide_has_text_at_an_interrupt_queued(
    client: Client, fake_llm: Any, make_user: Any, lg_profile: AgentProfile
) -> None:
    """Denying is a reviewer's decision: an owner outside the reviewers typing
    at an interrupt has the text queued (as on the API), nothing denied."""
    token = token_for(make_user("plain-owner"))
    thread = new_thread(client, token)
    turn(client, token, thread, fake_llm, "write", write_call("a.txt", "hi"))
    answer = run(client, token, thread, {"input": say("also this")})
    assert answer.status_code == 200, answer.json()
    queued = Event.objects.filter(session_id=thread, kind="input/queued").values_list("data", flat=True)
    assert [d["text"] for d in queued] == ["also this"]
    assert not Event.objects.filter(session_id=thread, kind="approval/resolved").exists()


def test_typing_at_an_interrupt_denies_the_parked_calls_and_is_the_next_input(
    client: Client, lg_token: str, fake_llm: Any
) -> None:
    """F5: agent-chat-ui answers each pending call with a tool message and sends
    the text: the calls are denied (the tool message gives the reason) and the
    model reads the text with the denials, in the same turn."""
    thread = new_thread(client, lg_token)
    two = Reply(
        tool_calls=[
            ("workspace.write", {"path": "a.txt", "content": "1"}),
            ("workspace.write", {"path": "b.txt", "content": "2"}),
        ]
    )
    turn(client, lg_token, thread, fake_llm, "write two", two)
    state = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=lg_token).json()
    calls = state["values"]["messages"][-1]["tool_calls"]
    first_call = calls[0]["id"]
    tool_reply = {"type": "tool", "tool_call_id": first_call, "id": "do-not-render-1", "content": "not now"}
    text = say("do something else")
    answer = run(client, lg_token, thread, {"input": {"messages": [tool_reply, *text["messages"]]}})
    assert answer.status_code == 200, answer.json()
    assert answer.json()["status"] == "running"
    verdicts = dict(
        Event.objects.filter(session_id=thread, kind="approval/resolved").values_list("data__call_id", "data__reason")
    )
    assert verdicts == {first_call: "not now", calls[1]["id"]: "the user sent a new message instead"}
    fake_llm.script(Reply(text="something else, then"))
    assert drive(thread) == "ended"
    sent = fake_llm.requests[-1]["messages"]
    assert [m["role"] for m in sent[-3:]] == ["tool", "tool", "user"]
    assert "do something else" in json.dumps(sent[-1])
    values = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=lg_token).json()["values"]
    assert values["messages"][-1]["content"] == "something else, then"
    assert Session.objects.get(id=thread).status == "idle"


def test_a_thread_without_a_graph_id_takes_its_first_runs_assistant(
    client: Client, lg_token: str, fake_llm: Any
) -> None:
    """F6: not the alphabetically first profile."""
    AgentProfile.objects.create(name="aaa-first", roles={"main": "test/model"})
    thread = new_thread(client, lg_token, metadata={})
    created = client.get(f"/lg/threads/{thread}", HTTP_X_API_KEY=lg_token).json()
    assert created["metadata"]["graph_id"] == "" and created["status"] == "idle"
    turn(client, lg_token, thread, fake_llm, "hello", Reply(text="hi"))
    assert Session.objects.get(id=thread).profile.name == PROFILE
    found = post(client, "/lg/threads/search", {"metadata": {"graph_id": PROFILE}}, lg_token).json()
    assert [t["thread_id"] for t in found] == [thread]
    by_id = {"metadata": {"assistant_id": mapping.assistant_id(PROFILE)}}  # agent-chat-ui's search for a uuid
    assert [t["thread_id"] for t in post(client, "/lg/threads/search", by_id, lg_token).json()] == [thread]
    other_id = {"metadata": {"assistant_id": mapping.assistant_id("aaa-first")}}
    assert post(client, "/lg/threads/search", other_id, lg_token).json() == []
    other = run(client, lg_token, thread, {"assistant_id": "aaa-first", "input": say("switch")})
    assert other.status_code == 400, "bound now: a thread keeps the assistant it began with"


def test_regenerate_forks_from_the_checkpoint_before_the_reply(client: Client, lg_token: str, fake_llm: Any) -> None:
    """F7: agent-chat-ui's Refresh: a run with no input from the reply's parent
    checkpoint asks for that reply again, in a fork named by Content-Location."""
    thread = new_thread(client, lg_token)
    turn(client, lg_token, thread, fake_llm, "hello", Reply(text="first answer"))
    history = post(client, f"/lg/threads/{thread}/history", {"limit": 10}, lg_token).json()
    reply_state = next(
        h for h in reversed(history) if h["values"]["messages"][-1:] and h["values"]["messages"][-1]["type"] == "ai"
    )
    parent = reply_state["parent_checkpoint"]
    fake_llm.script(Reply(text="second answer"))
    answer = run(client, lg_token, thread, {"input": None, "checkpoint": parent})
    assert answer.status_code == 200, answer.json()
    fork = answer.json()["thread_id"]
    assert fork != thread and answer["Content-Location"].startswith(f"/threads/{fork}/runs/")
    assert drive(fork) == "ended"
    values = client.get(f"/lg/threads/{fork}/state", HTTP_X_API_KEY=lg_token).json()["values"]
    assert [m["content"] for m in values["messages"]] == ["hello", "second answer"]
    assert Event.objects.filter(session_id=fork, kind="turn/start", data__regenerate=True).count() == 1
    mine = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=lg_token).json()["values"]
    assert [m["content"] for m in mine["messages"]] == ["hello", "first answer"], "the thread itself is unchanged"


def test_a_refused_fork_request_creates_nothing(client: Client, lg_token: str, fake_llm: Any) -> None:
    """L3: validation runs before the fork, on every path that forks."""
    thread = new_thread(client, lg_token)
    turn(client, lg_token, thread, fake_llm, "hello", Reply(text="one"))
    turn(client, lg_token, thread, fake_llm, "again", Reply(text="two"))
    history = post(client, f"/lg/threads/{thread}/history", {"limit": 10}, lg_token).json()
    old = history[-1]["checkpoint"]
    sessions, events = Session.objects.count(), Event.objects.count()
    for body, code in [
        ({"input": {"messages": [{"role": "ai", "content": "x"}]}, "checkpoint": old}, "invalid_input"),
        ({"input": {"messages": [{"role": "user", "content": "   "}]}, "checkpoint": old}, "invalid_input"),
        ({"input": {"messages": [{"role": "user", "content": "a\x00b"}]}, "checkpoint": old}, "invalid_input"),
        ({"input": say("x"), "checkpoint": old, "multitask_strategy": "bogus"}, "invalid_input"),
        ({"input": say("x"), "checkpoint": old, "assistant_id": "nobody"}, "invalid_input"),
        ({"command": {"resume": {"decisions": []}}, "checkpoint": old}, "not_supported"),
        ({"checkpoint": history[0]["parent_checkpoint"] | {"checkpoint_id": "seq-1"}}, "invalid_input"),
    ]:
        answer = run(client, lg_token, thread, body)
        assert answer.json()["code"] == code, (body, answer.json())
    assert (Session.objects.count(), Event.objects.count()) == (sessions, events)


def test_a_foreign_thread_id_answers_as_a_missing_one(client: Client, lg_token: str, make_user: Any) -> None:
    """L6: creating a thread with an id tells nothing about which ids exist."""
    theirs = new_thread(client, lg_token)
    stranger = token_for(make_user("stranger"))  # not a reviewer: the thread is not theirs to read
    answers = []
    for wanted in (theirs, str(uuid.uuid4())):
        got = post(client, "/lg/threads", {"thread_id": wanted, "if_exists": "do_nothing"}, stranger)
        answers.append((got.status_code, got.json()["code"]))
    assert answers[0] == answers[1] == (422, "not_supported")
    mine = new_thread(client, lg_token)
    again = post(client, "/lg/threads", {"thread_id": mine, "if_exists": "do_nothing"}, lg_token).json()
    assert again["thread_id"] == mine


def test_message_frames_go_before_values_and_a_streamed_reply_is_not_resent() -> None:
    """F4, at the stream: useStream places a message first met in a `messages`
    frame at the end of its list, so that frame must precede the `values`
    holding it; a reply streamed as deltas on this connection is completed,
    not sent again whole; a late delta of a committed step is dropped."""
    sid = uuid.uuid4()
    rs = stream.RunStream(stream.Plan(sid, mapping.run_id(sid, 1), 1, ("values", "messages-tuple"), None, None))
    for event in (
        LoggedEvent(1, "turn/start", {}),
        LoggedEvent(2, "user/message", {"text": "hi"}),
        LoggedEvent(3, "step/start", {"step": 1}),
    ):
        rs.frames_for(event)
    assert "Hel" in rs.delta_text({"step": 1, "text": "Hel"})
    rs.delta_text({"step": 1, "text": "lo"})
    frames = rs.frames_for(LoggedEvent(4, "assistant/message", {"content": "Hello!", "tool_calls": []}))
    assert [name for name, _ in frames] == ["messages", "values"]
    chunk = frames[0][1][0]
    assert chunk["type"] == "AIMessageChunk" and chunk["content"] == "!" and chunk["id"] == "ai-1-1"
    assert frames[1][1]["messages"][-1]["content"] == "Hello!"
    assert rs.delta_text({"step": 1, "text": "late"}) == ""
    # A step nobody streamed on this connection (a replay) comes whole.
    rs.frames_for(LoggedEvent(5, "step/start", {"step": 2}))
    calls = [{"id": "c1", "name": "clock.now", "arguments": "{}"}]
    frames = rs.frames_for(LoggedEvent(6, "assistant/message", {"content": "", "tool_calls": calls}))
    assert [name for name, _ in frames] == ["messages", "values"]
    assert frames[0][1][0]["type"] == "ai" and frames[0][1][0]["tool_calls"][0]["name"] == "clock.now"


@pytest.mark.parametrize("value", [None, "", [], [""]])
def test_empty_or_absent_stream_mode_is_the_runs_own(value: Any) -> None:
    """What the SDKs send for their defaults (join_stream's `stream_mode=`)."""
    assert stream.parse_modes(value) == stream.DEFAULT_MODES
    assert stream.parse_last_event_id("-1") is None  # useStream's joinStream: from the start
