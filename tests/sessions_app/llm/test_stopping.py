"""Stopping a model call: its deadline, a cancel, permanent failures, and
what the provider's message may carry. Against FakeLLM over real HTTP."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import httpx
import pytest

from sessions_app.llm import deadline
from sessions_app.llm.abort import CANCELLED, Abort
from sessions_app.llm.openai import REDACTED, OpenAIAdapter, redact
from sessions_app.llm.registry import complete_utility
from sessions_app.llm.types import (
    ModelCancelled,
    ModelDeadline,
    ModelRejected,
    ModelUnavailable,
    ToolSpec,
    Usage,
)
from tests.fakes.fake_llm import FakeLLM, Reply, chunks_for

SPEC = "test/model"
USER = [{"role": "user", "content": "hi"}]
KEY = "terret-test-secret-4f9a2c7e1b"  # not key-shaped: only the configured value can be redacted


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def make(llm: FakeLLM, **overrides: float) -> OpenAIAdapter:
    options = {"timeout": 5.0, "retries": 2, "backoff_base": 0.0, **overrides}
    return OpenAIAdapter(base_url=llm.base_url, api_key=KEY, **options)  # type: ignore[arg-type]


def set_later(abort: Abort, when: Callable[[], bool], stamp: list[float]) -> threading.Thread:
    """Cancel from another thread, as the runtime does, once `when()` holds."""

    def run() -> None:
        limit = time.monotonic() + 10
        while not when() and time.monotonic() < limit:
            time.sleep(0.01)
        stamp.append(time.monotonic())
        abort.set(CANCELLED)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def after(seconds: float) -> Callable[[], bool]:
    end = time.monotonic() + seconds
    return lambda: time.monotonic() >= end


# -- the deadline -----------------------------------------------------------


def test_keepalives_forever_do_not_extend_the_deadline(llm: FakeLLM) -> None:
    llm.script(Reply(text="never sent", keepalive_forever=True))
    started = time.monotonic()

    with pytest.raises(ModelDeadline, match="deadline"):
        make(llm, deadline=1.0).complete(SPEC, USER, [])

    assert 0.9 <= time.monotonic() - started < 2.0
    assert llm.keepalives_sent >= 3  # the comments kept coming, well within the 5 s read timeout
    assert len(llm.requests) == 1


def test_keepalives_after_some_text_do_not_extend_it_either(llm: FakeLLM) -> None:
    llm.script(Reply(text="some words first", keepalive_forever=True, keepalive_after=3))
    deltas: list[str] = []
    started = time.monotonic()

    with pytest.raises(ModelDeadline):
        make(llm, deadline=1.0).complete(SPEC, USER, [], deltas.append)

    assert time.monotonic() - started < 2.0
    assert deltas == ["some ", "words "]


def test_deadline_stops_a_silent_wait_for_the_response(llm: FakeLLM) -> None:
    llm.script(Reply(text="too late", latency=30))
    started = time.monotonic()

    with pytest.raises(ModelDeadline):
        make(llm, deadline=1.0).complete(SPEC, USER, [])

    assert time.monotonic() - started < 2.0  # the read timeout alone would wait 5 s
    assert len(llm.requests) == 1


def test_deadline_stops_a_silent_stream_mid_reply(llm: FakeLLM) -> None:
    llm.script(Reply(text="first then nothing", hang=True))
    deltas: list[str] = []
    started = time.monotonic()

    with pytest.raises(ModelDeadline):
        make(llm, deadline=1.0).complete(SPEC, USER, [], deltas.append)

    assert time.monotonic() - started < 2.0
    assert deltas == ["first "]


def test_deadline_spans_retries(llm: FakeLLM) -> None:
    llm.responder = lambda body: Reply(latency=30)
    impatient = make(llm, timeout=0.3, retries=50, deadline=1.2)
    started = time.monotonic()

    with pytest.raises(ModelDeadline):
        impatient.complete(SPEC, USER, [])

    assert time.monotonic() - started < 2.2
    assert 2 <= len(llm.requests) <= 5  # retried on read timeouts, until the deadline


def test_deadline_cuts_a_backoff_sleep(llm: FakeLLM) -> None:
    llm.script(Reply(status=503, retry_after=30), Reply(text="never asked for"))
    started = time.monotonic()

    with pytest.raises(ModelDeadline):
        make(llm, deadline=1.0).complete(SPEC, USER, [])

    assert time.monotonic() - started < 2.0
    assert len(llm.requests) == 1


def test_deadline_comes_from_settings(llm: FakeLLM, settings: object) -> None:
    settings.TERRET_LLM_DEADLINE_SECONDS = 1.0  # type: ignore[attr-defined]
    llm.script(Reply(keepalive_forever=True))
    started = time.monotonic()

    with pytest.raises(ModelDeadline, match="1s"):
        OpenAIAdapter(base_url=llm.base_url, timeout=5.0, retries=0).complete(SPEC, USER, [])

    assert time.monotonic() - started < 2.0


def test_deadline_errors_are_transient() -> None:
    assert ModelDeadline.transient and ModelUnavailable.transient
    assert not ModelRejected.transient


def test_one_watchdog_serves_many_calls_and_none_stays_armed(llm: FakeLLM) -> None:
    llm.responder = lambda body: Reply(text="ok", latency=0.2)
    adapter = make(llm)
    before = deadline.pending()
    errors: list[Exception] = []

    def run() -> None:
        try:
            adapter.complete(SPEC, USER, [])
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert deadline.watchdog_threads() == 1
    assert deadline.pending() == before


# -- a cancel ---------------------------------------------------------------


def test_cancel_mid_stream_returns_at_once_with_the_partial_text(llm: FakeLLM) -> None:
    llm.script(Reply(text="first then nothing", hang=True))
    abort, deltas, stamp = Abort(), [], []
    set_later(abort, lambda: bool(deltas), stamp)

    with pytest.raises(ModelCancelled) as caught:
        make(llm).complete(SPEC, USER, [], deltas.append, abort=abort)

    assert time.monotonic() - stamp[0] < 1.0
    assert caught.value.partial.content == "first "
    assert caught.value.partial.tool_calls == []
    assert len(llm.requests) == 1  # not retried


def test_cancel_keeps_text_and_usage_and_drops_half_streamed_tool_calls(llm: FakeLLM) -> None:
    shape = Reply(text="Let me check", tool_calls=[("clock.now", {"tz": "UTC"})], usage=(9, 4, 0.001))
    everything = len(chunks_for(shape))
    # First stalled after the tool call's head (role, three words, head), then after every chunk, usage included.
    llm.script(*[replace(shape, keepalive_forever=True, keepalive_after=n) for n in (5, everything)])
    tools = [ToolSpec("clock.now", "the time", {"type": "object", "properties": {}})]
    adapter = make(llm)

    for _ in range(2):
        abort, stamp = Abort(), []
        set_later(abort, after(0.5), stamp)
        with pytest.raises(ModelCancelled) as caught:
            adapter.complete(SPEC, USER, tools, lambda _: None, abort=abort)
        assert time.monotonic() - stamp[0] < 1.0
        assert caught.value.partial.content == "Let me check"
        assert caught.value.partial.tool_calls == []
    assert caught.value.partial.usage == Usage(9, 4, 0.001)  # the second stream had sent its usage


def test_cancel_during_keepalives(llm: FakeLLM) -> None:
    llm.script(Reply(text="never sent", keepalive_forever=True))
    abort, stamp = Abort(), []
    set_later(abort, after(0.5), stamp)

    with pytest.raises(ModelCancelled) as caught:
        make(llm).complete(SPEC, USER, [], abort=abort)

    assert time.monotonic() - stamp[0] < 1.0
    assert caught.value.partial.content is None


def test_cancel_before_the_response_begins(llm: FakeLLM) -> None:
    llm.script(Reply(text="too late", latency=30))
    abort, stamp = Abort(), []
    set_later(abort, after(0.3), stamp)

    with pytest.raises(ModelCancelled):
        make(llm).complete(SPEC, USER, [], abort=abort)

    assert time.monotonic() - stamp[0] < 1.0
    assert len(llm.requests) == 1


def test_cancel_during_a_retry_backoff(llm: FakeLLM) -> None:
    llm.script(Reply(status=503), Reply(text="never asked for"))
    abort, stamp = Abort(), []
    set_later(abort, after(0.3), stamp)

    with pytest.raises(ModelCancelled):
        make(llm, backoff_base=20.0).complete(SPEC, USER, [], abort=abort)  # a 10-20 s pause

    assert time.monotonic() - stamp[0] < 1.0
    assert len(llm.requests) == 1


def test_an_abort_set_before_the_call_sends_nothing(llm: FakeLLM) -> None:
    abort = Abort()
    abort.set(CANCELLED)
    with pytest.raises(ModelCancelled):
        make(llm).complete(SPEC, USER, [], abort=abort)
    assert llm.requests == []


def test_the_thread_client_works_after_a_cut(llm: FakeLLM) -> None:
    """A cut before the headers shuts down the thread's idle connections too;
    the pool must notice and connect afresh."""
    adapter = make(llm)
    llm.script(Reply(text="one"), Reply(latency=30), Reply(text="three"))
    assert adapter.complete(SPEC, USER, []).content == "one"
    abort, stamp = Abort(), []
    set_later(abort, after(0.3), stamp)
    with pytest.raises(ModelCancelled):
        adapter.complete(SPEC, USER, [], abort=abort)

    assert adapter.complete(SPEC, USER, []).content == "three"
    assert len(llm.requests) == 3


def test_utility_requests_take_an_abort(llm: FakeLLM, settings: object) -> None:
    settings.TERRET_LLM_BASE_URL = llm.base_url  # type: ignore[attr-defined]
    llm.script(Reply(text="A title", hang=True))
    abort, stamp = Abort(), []
    set_later(abort, after(0.3), stamp)

    with pytest.raises(ModelCancelled):
        complete_utility("openrouter/some-model", USER, abort=abort)

    assert time.monotonic() - stamp[0] < 1.0


# -- permanent and transient failures ----------------------------------------


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 422])
def test_a_permanent_4xx_fails_at_once(llm: FakeLLM, status: int) -> None:
    llm.script(Reply(status=status, error_message=f"No endpoints found for {SPEC} ({status})"))

    with pytest.raises(ModelRejected, match=rf"HTTP {status}.*No endpoints found for test/model") as caught:
        make(llm, retries=3).complete(SPEC, USER, [])

    assert not caught.value.transient
    assert len(llm.requests) == 1


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
def test_transient_statuses_are_retried_then_unavailable(llm: FakeLLM, status: int) -> None:
    llm.script(*[Reply(status=status, error_message="try again later")] * 3)

    with pytest.raises(ModelUnavailable, match=rf"3 attempt.*HTTP {status}.*try again later") as caught:
        make(llm, retries=2).complete(SPEC, USER, [])

    assert caught.value.transient
    assert not isinstance(caught.value, ModelDeadline)
    assert len(llm.requests) == 3


def test_a_permanent_error_chunk_with_a_string_code_is_rejected(llm: FakeLLM) -> None:
    llm.script(Reply(stream_error=(404, "model was retired")))
    with pytest.raises(ModelRejected, match="model was retired"):
        make(llm).complete(SPEC, USER, [])
    assert len(llm.requests) == 1


# -- what the provider's message may carry -----------------------------------


def test_the_configured_key_never_reaches_the_error(llm: FakeLLM) -> None:
    llm.script(Reply(status=401, error_message="Invalid credentials", echo_key=True))

    with pytest.raises(ModelRejected, match="Invalid credentials") as caught:
        make(llm).complete(SPEC, USER, [])

    assert KEY not in str(caught.value)
    assert REDACTED in str(caught.value)


def test_the_key_is_redacted_from_retried_errors_and_their_logs(llm: FakeLLM, caplog: pytest.LogCaptureFixture) -> None:
    llm.script(*[Reply(status=500, error_message=f"upstream rejected key {KEY}")] * 3)
    caplog.set_level(logging.WARNING, logger="sessions_app.llm.openai")

    with pytest.raises(ModelUnavailable) as caught:
        make(llm).complete(SPEC, USER, [])

    assert KEY not in str(caught.value)
    assert KEY not in str(caught.value.__cause__)
    assert "retrying" in caplog.text and KEY not in caplog.text


def test_key_shaped_tokens_are_redacted_mid_stream(llm: FakeLLM) -> None:
    token = "sk-or-v1-" + "0123456789abcdef" * 4
    llm.script(Reply(stream_error=(400, f"key {token} has no access")))

    with pytest.raises(ModelRejected, match="has no access") as caught:
        make(llm).complete(SPEC, USER, [])

    assert token not in str(caught.value)
    assert "sk-or-v1" not in str(caught.value)


def test_long_provider_messages_are_cut(llm: FakeLLM) -> None:
    llm.script(Reply(status=400, error_message="very long complaint " * 500))
    with pytest.raises(ModelRejected) as caught:
        make(llm).complete(SPEC, USER, [])
    assert len(str(caught.value)) < 600


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("key sk-proj-abcdefghijklmnopqrstuvwxyz012345 rejected", "abcdefghijklmnop"),
        ("Incorrect API key provided: sk-or-v1-1a2b3c4d5e6f7a8b9c0d1e2f", "1a2b3c4d5e6f"),
        ("header was Authorization: Bearer abc.def-ghi_jkl", "abc.def-ghi_jkl"),
        ('{"api_key": "hunter2hunter2"}', "hunter2hunter2"),
        ("google key AIzaSyA1234567890abcdefghijklmnopqrstu", "AIzaSyA1234567890"),
        (f"you sent {KEY} twice: {KEY}", KEY),
    ],
)
def test_redact(text: str, gone: str) -> None:
    cleaned = redact(text, [KEY])
    assert gone not in cleaned
    assert REDACTED in cleaned


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "No endpoints found for anthropic/claude-sonnet-4 (skip-list: 3 providers)."
    assert redact(text, ["short", ""]) == text


# -- what the fake server can send -------------------------------------------


def test_a_huge_text_streams_in_big_chunks(llm: FakeLLM) -> None:
    text = ("lorem ipsum dolor sit amet " * 400_000)[: 10 * 1024 * 1024]
    llm.script(Reply(text=text))
    deltas: list[str] = []
    started = time.monotonic()

    reply = make(llm, timeout=30.0).complete(SPEC, USER, [], deltas.append)

    assert reply.content == text
    assert 500 < len(deltas) < 1000  # 16 KiB pieces, not two million words
    assert time.monotonic() - started < 15


def test_nul_bytes_in_text_survive_the_wire(llm: FakeLLM) -> None:
    text = "a\x00b c\x00"
    llm.script(Reply(text=text), Reply(text=text))
    raw = httpx.post(f"{llm.base_url}/chat/completions", json={"model": SPEC, "messages": USER}).text
    assert "\\u0000" in raw and "\x00" not in raw

    assert make(llm).complete(SPEC, USER, []).content == text
