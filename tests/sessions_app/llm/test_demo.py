"""The offline demo model: deterministic tool choices and replies, no network."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from sessions_app.llm.abort import CANCELLED, DEADLINE, Abort
from sessions_app.llm.demo import DemoAdapter
from sessions_app.llm.registry import complete_utility, get_adapter
from sessions_app.llm.types import DEMO_SPEC, ModelCancelled, ModelDeadline, ModelReply, ToolSpec

ALL_TOOLS = [
    ToolSpec(name, f"the {name} tool", {"type": "object", "properties": {}})
    for name in ("clock.now", "workspace.write", "workspace.read", "workspace.list")
]


@pytest.fixture(autouse=True)
def no_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERRET_DEMO_DELAY", "0")


def ask(text: str, tools: list[ToolSpec] = ALL_TOOLS) -> ModelReply:
    return DemoAdapter().complete(DEMO_SPEC, [{"role": "user", "content": text}], tools)


def only_call(reply: ModelReply) -> tuple[str, dict[str, Any]]:
    assert reply.content is None
    assert reply.finish_reason == "tool_calls"
    assert len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    return call.name, json.loads(call.arguments)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What time is it?", ("clock.now", {})),
        ("clock please", ("clock.now", {})),
        ("Please list the files", ("workspace.list", {})),
        (
            "write notes/todo.txt: buy milk\nand eggs",
            ("workspace.write", {"path": "notes/todo.txt", "content": "buy milk\nand eggs"}),
        ),
        ("write me a poem", ("workspace.write", {"path": "demo-note.txt", "content": "write me a poem"})),
        ("read notes/todo.txt.", ("workspace.read", {"path": "notes/todo.txt"})),
        ("Read the file a.md", ("workspace.read", {"path": "a.md"})),
        ("list the files", ("workspace.list", {})),
    ],
)
def test_user_messages_pick_tools(text: str, expected: tuple[str, dict[str, Any]]) -> None:
    assert only_call(ask(text)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "I wonder what time it is",
        "make a shopping list for me",
        "should I read more books?",
        "how do I write a sonnet?",
        "the clock is ticking",
    ],
)
def test_keywords_inside_a_sentence_are_answered_as_text(text: str) -> None:
    reply = ask(text)
    assert reply.tool_calls == [] and reply.finish_reason == "stop"
    assert text in (reply.content or "")


def _after_result(content: str) -> str:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "write a.txt: hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "workspace.write", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": content},
    ]
    return DemoAdapter().complete(DEMO_SPEC, messages, ALL_TOOLS).content or ""


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("denied: not today", "workspace.write was denied, so it did not run: not today"),
        ("vetoed: workspace.write is not allowed", "workspace.write was vetoed, so it did not run"),
    ],
)
def test_a_denial_or_a_veto_is_reported_as_such(content: str, said: str) -> None:
    text = _after_result(content)
    assert said in text
    assert "Done." not in text and "Nothing was done." in text


def test_a_result_that_ran_is_done() -> None:
    text = _after_result("wrote 2 bytes to a.txt")
    assert "Done. workspace.write returned: wrote 2 bytes" in text


def test_tool_call_ids_are_unique_and_prefixed() -> None:
    ids = {ask("what time is it").tool_calls[0].id for _ in range(20)}
    assert len(ids) == 20
    assert all(i.startswith("demo_") and len(i) > len("demo_") for i in ids)


def test_only_offered_tools_are_called() -> None:
    reply = ask("what time is it", [t for t in ALL_TOOLS if t.name != "clock.now"])
    assert reply.tool_calls == []
    assert reply.finish_reason == "stop"
    assert "clock.now" in (reply.content or "")
    assert "does not have that tool" in (reply.content or "")


def test_plain_message_gets_an_honest_echo() -> None:
    reply = ask("tell me a joke")
    assert reply.tool_calls == []
    assert "offline demo model" in (reply.content or "")
    assert "tell me a joke" in (reply.content or "")


def test_text_streams_word_by_word() -> None:
    deltas: list[str] = []
    reply = DemoAdapter().complete(DEMO_SPEC, [{"role": "user", "content": "hello demo"}], ALL_TOOLS, deltas.append)
    assert len(deltas) > 5
    assert "".join(deltas) == reply.content
    assert all(d.strip() and " " not in d.strip() for d in deltas)  # one word per delta


def test_tool_calls_stream_no_text() -> None:
    deltas: list[str] = []
    DemoAdapter().complete(DEMO_SPEC, [{"role": "user", "content": "list"}], ALL_TOOLS, deltas.append)
    assert deltas == []


def test_delay_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERRET_DEMO_DELAY", "0.01")
    deltas: list[str] = []
    started = time.monotonic()
    DemoAdapter().complete(DEMO_SPEC, [{"role": "user", "content": "hello"}], [], deltas.append)
    assert time.monotonic() - started >= 0.01 * len(deltas) * 0.9


def test_tool_results_are_summarised() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "what time is it and list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "clock.now", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "workspace.list", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "2026-01-01T12:00:00Z"},
        {"role": "tool", "tool_call_id": "c2", "content": "a.txt\nb.txt" + "x" * 500},
    ]
    reply = DemoAdapter().complete(DEMO_SPEC, messages, ALL_TOOLS)
    text = reply.content or ""
    assert reply.tool_calls == []
    assert "clock.now returned: 2026-01-01T12:00:00Z" in text
    assert "workspace.list returned: a.txt" in text
    assert len(text) < 600  # long results are cut short


def test_usage_is_estimated_and_free() -> None:
    short = ask("hi")
    long = ask("hi " * 400)
    assert short.usage is not None and long.usage is not None
    assert short.usage.cost == 0.0
    assert long.usage.prompt_tokens > short.usage.prompt_tokens + 250  # ~chars / 4
    assert long.usage.completion_tokens > short.usage.completion_tokens  # the echo grows too


def test_titler_request_gets_a_short_title() -> None:
    messages = [
        {"role": "system", "content": "Write a short title (max 6 words) for this conversation."},
        {"role": "user", "content": "Please help me plan a trip to Lisbon next spring with kids"},
    ]
    reply = complete_utility(DEMO_SPEC, messages)
    assert reply.content == "Please help me plan a trip"
    assert reply.tool_calls == []


def test_agent_system_prompt_mentioning_title_is_not_a_titler_request() -> None:
    messages = [
        {"role": "system", "content": "You are an agent. Give every answer a title."},
        {"role": "user", "content": "what time is it"},
    ]
    reply = DemoAdapter().complete(DEMO_SPEC, messages, ALL_TOOLS)
    assert only_call(reply) == ("clock.now", {})


def test_registry_serves_the_demo_singleton() -> None:
    assert isinstance(get_adapter(DEMO_SPEC), DemoAdapter)
    assert get_adapter(DEMO_SPEC) is get_adapter("demo/anything")


# -- stopping ---------------------------------------------------------------


def test_a_cancel_mid_stream_keeps_the_words_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERRET_DEMO_DELAY", "0.01")
    abort, deltas = Abort(), []

    def sink(word: str) -> None:
        deltas.append(word)
        if len(deltas) == 3:
            abort.set(CANCELLED)

    with pytest.raises(ModelCancelled) as caught:
        DemoAdapter().complete(DEMO_SPEC, [{"role": "user", "content": "hello demo"}], [], sink, abort=abort)

    assert len(deltas) == 3
    assert caught.value.partial.content == "".join(deltas)
    assert caught.value.partial.tool_calls == []


def test_a_cancel_from_another_thread_ends_the_pause_between_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERRET_DEMO_DELAY", "5")
    abort = Abort()
    threading.Timer(0.2, abort.set, args=(CANCELLED,)).start()
    started = time.monotonic()

    with pytest.raises(ModelCancelled):
        DemoAdapter().complete(DEMO_SPEC, [{"role": "user", "content": "hello"}], [], lambda _: None, abort=abort)

    assert time.monotonic() - started < 1.0


def test_an_abort_set_before_the_call_stops_even_a_tool_call() -> None:
    cancelled, expired = Abort(), Abort()
    cancelled.set(CANCELLED)
    expired.set(DEADLINE)
    with pytest.raises(ModelCancelled):
        DemoAdapter().complete(DEMO_SPEC, [{"role": "user", "content": "list"}], ALL_TOOLS, abort=cancelled)
    with pytest.raises(ModelDeadline):
        complete_utility(DEMO_SPEC, [{"role": "user", "content": "hi"}], abort=expired)


def test_an_unset_abort_changes_nothing() -> None:
    deltas: list[str] = []
    messages = [{"role": "user", "content": "hello demo"}]
    reply = DemoAdapter().complete(DEMO_SPEC, messages, ALL_TOOLS, deltas.append, abort=Abort())
    assert "".join(deltas) == reply.content
