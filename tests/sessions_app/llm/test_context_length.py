"""Context-length errors: recognised in one place (openai.context_error),
raised as ContextTooLong, and enforced by FakeLLM's `max_context_chars`.
All over real HTTP, as in test_openai.py."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sessions_app.llm.openai import REDACTED, OpenAIAdapter, context_error
from sessions_app.llm.registry import complete_utility
from sessions_app.llm.types import ContextTooLong, ModelRejected, ModelUnavailable, TornStream
from tests.fakes.fake_llm import REFUSALS, FakeLLM, Reply, request_size

SPEC = "test/model"
KEY = "sk-test-0123456789abcdef0123"


def user(chars: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "x" * chars}]


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


@pytest.fixture
def adapter(llm: FakeLLM) -> OpenAIAdapter:
    return OpenAIAdapter(base_url=llm.base_url, api_key=KEY, timeout=5.0, retries=2, backoff_base=0.0)


def refusal(adapter: OpenAIAdapter, messages: list[dict[str, Any]] | None = None) -> ContextTooLong:
    with pytest.raises(ContextTooLong) as caught:
        adapter.complete(SPEC, messages or user(10), [])
    return caught.value


# -- the fake's context window ----------------------------------------------


def test_a_request_over_the_window_is_refused_as_context_too_long(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.max_context_chars = 4000
    llm.script(Reply(text="kept for later"))

    err = refusal(adapter, user(9000))

    assert isinstance(err, ModelRejected)
    assert not err.transient
    assert (err.limit_tokens, err.requested_tokens) == (1000, 2250)
    assert re.search(r"HTTP 400 .*maximum context length is 1000 tokens", str(err))
    assert len(llm.requests) == 1  # permanent: not retried
    assert len(llm.refused) == 1 and llm.accepted == []
    # The scripted reply was not used up by the refusal.
    assert adapter.complete(SPEC, user(100), []).content == "kept for later"
    assert len(llm.requests) == 2 and len(llm.accepted) == 1


def test_the_refusal_is_openais_body(llm: FakeLLM) -> None:
    llm.max_context_chars = 100
    response = httpx.post(f"{llm.base_url}/chat/completions", json={"model": SPEC, "messages": user(101)})

    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "This model's maximum context length is 25 tokens. However, your messages resulted in 25 "
            "tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def test_a_request_within_the_window_passes(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.max_context_chars = 100
    llm.script(Reply(text="fits"), Reply(text="just fits"))

    assert adapter.complete(SPEC, user(10), []).content == "fits"
    assert adapter.complete(SPEC, user(100), []).content == "just fits"  # exactly the limit is within it
    assert llm.refused == [] and len(llm.accepted) == 2


def test_the_window_can_change_while_the_server_runs(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    assert adapter.complete(SPEC, user(500), []).content == "ok"  # no limit by default
    llm.max_context_chars = 400
    refusal(adapter, user(500))
    llm.max_context_chars = None
    assert adapter.complete(SPEC, user(500), []).content == "ok"
    assert [len(r["messages"][0]["content"]) for r in llm.refused] == [500]
    assert len(llm.accepted) == 2 and len(llm.requests) == 3


def test_the_size_counts_contents_text_parts_and_tool_calls(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "clock.now", "arguments": '{"tz": "UTC"}'}}
    history = [
        {"role": "system", "content": "be brief"},  # 8
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {}}]},  # 5
        {"role": "assistant", "content": None, "tool_calls": [call]},  # clock__now on the wire (10) + 13
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},  # 5
    ]
    size = 8 + 5 + len("clock__now") + len('{"tz": "UTC"}') + 5

    llm.max_context_chars = size
    assert adapter.complete(SPEC, history, []).content == "done"  # the last message is a tool result
    assert request_size(llm.requests[0]) == size
    llm.max_context_chars = size - 1
    err = refusal(adapter, history)
    assert err.requested_tokens == size // 4


# What each wording states: (limit, requested) for 9,000 characters against 4,000.
STATED = {
    "openai": (1000, 2250),
    "openai-no-figures": (None, None),
    "anthropic": (1000, 2250),
    "openrouter": (1000, 2250),
    "bare": (None, None),
}


@pytest.mark.parametrize("wording", REFUSALS)
def test_every_wording_of_the_fake_is_a_context_too_long(llm: FakeLLM, adapter: OpenAIAdapter, wording: str) -> None:
    llm.max_context_chars = 4000
    llm.refusal = wording

    err = refusal(adapter, user(9000))

    assert (err.limit_tokens, err.requested_tokens) == STATED[wording]
    assert not err.transient and len(llm.requests) == 1


@pytest.mark.parametrize(
    ("wording", "body"),
    [
        ("bare", {"error": {"code": "context_length_exceeded"}}),
        (
            "anthropic",
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "prompt is too long: 25 tokens > 25 maximum"},
            },
        ),
        (
            "openai-no-figures",
            {
                "error": {
                    "message": "Your input exceeds the context window of this model. Please adjust your input and try "
                    "again.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
        ),
    ],
)
def test_the_wordings_are_each_providers_body(llm: FakeLLM, wording: str, body: dict[str, Any]) -> None:
    llm.max_context_chars = 100
    llm.refusal = wording
    response = httpx.post(f"{llm.base_url}/chat/completions", json={"model": SPEC, "messages": user(101)})
    assert (response.status_code, response.json()) == (400, body)


def test_the_standalone_server_takes_a_max_context() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.fake_llm", "--max-context", "40"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        standalone = OpenAIAdapter(base_url=proc.stdout.readline().strip(), retries=0)
        assert standalone.complete(SPEC, user(40), []).content == "ok"
        with pytest.raises(ContextTooLong) as caught:
            standalone.complete(SPEC, user(41), [])
        assert (caught.value.limit_tokens, caught.value.requested_tokens) == (10, 10)
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0


def test_the_standalone_server_takes_a_wording() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.fake_llm", "--max-context", "40", "--refusal", "bare"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        standalone = OpenAIAdapter(base_url=proc.stdout.readline().strip(), retries=0)
        with pytest.raises(ContextTooLong) as caught:
            standalone.complete(SPEC, user(41), [])
        assert (caught.value.limit_tokens, caught.value.requested_tokens) == (None, None)
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0


# -- what providers say ------------------------------------------------------

ANTHROPIC_RAW = json.dumps(
    {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"},
    }
)


@pytest.mark.parametrize(
    ("reply", "limit", "requested"),
    [
        pytest.param(
            Reply(
                status=400,
                error_message="This model's maximum context length is 8192 tokens. However, your messages resulted "
                "in 9000 tokens. Please reduce the length of the messages.",
            ),
            8192,
            9000,
            id="openai",
        ),
        pytest.param(
            Reply(
                status=400,
                error_message="This endpoint's maximum context length is 8192 tokens. However, you requested about "
                "9000 tokens (7000 of text input, 2000 in the output). Please reduce the length of either one, or "
                'use the "middle-out" transform to compress your prompt automatically.',
            ),
            8192,
            9000,
            id="openrouter",
        ),
        pytest.param(
            Reply(
                status=400,
                error_message="This model's maximum context length is 8,192 tokens, however you requested 8,977 "
                "tokens (8977 in your prompt; 0 for the completion).",
            ),
            8192,
            8977,
            id="older-openai-with-commas",
        ),
        pytest.param(
            Reply(status=400, error_message="prompt is too long: 210000 tokens > 200000 maximum"),
            200000,
            210000,
            id="anthropic",
        ),
        pytest.param(
            Reply(status=400, error_message="Provider returned error", error_raw=ANTHROPIC_RAW),
            200000,
            210000,
            id="anthropic-via-openrouter-metadata-raw",
        ),
        pytest.param(Reply(status=400, error_message="Context length exceeded"), None, None, id="phrase"),
        pytest.param(
            Reply(status=400, error_message="upstream: context_length_exceeded (x)"), None, None, id="code-in-text"
        ),
        pytest.param(
            Reply(status=400, error_message="Request too large", error_code="context_length_exceeded"),
            None,
            None,
            id="code",
        ),
        pytest.param(
            Reply(status=400, error_message="Request too large", error_type="context_length_exceeded"),
            None,
            None,
            id="type",
        ),
        pytest.param(
            Reply(
                status=400,
                error_message="This model's maximum context length is 4096 tokens.",
                error_code="context_length_exceeded",
            ),
            4096,
            None,
            id="code-with-a-limit-only",
        ),
        pytest.param(
            Reply(status=413, error_message="prompt is too long: 210000 tokens > 200000 maximum"),
            200000,
            210000,
            id="another-permanent-4xx",
        ),
    ],
)
def test_provider_messages_are_recognised(
    llm: FakeLLM, adapter: OpenAIAdapter, reply: Reply, limit: int | None, requested: int | None
) -> None:
    llm.script(reply)

    err = refusal(adapter)

    assert (err.limit_tokens, err.requested_tokens) == (limit, requested)
    assert not err.transient
    assert str(err).startswith(f"HTTP {reply.status} from the model provider: ")
    assert len(llm.requests) == 1


@pytest.mark.parametrize(
    "message",
    [
        "test/model is not a valid model ID",
        "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for this model",
        "This request requires more credits, or fewer max_tokens. You requested up to 4096 tokens, but can afford 100.",
        "the context parameter is invalid",
    ],
)
def test_other_400s_stay_plain_rejections(llm: FakeLLM, adapter: OpenAIAdapter, message: str) -> None:
    llm.script(Reply(status=400, error_message=message))

    with pytest.raises(ModelRejected) as caught:
        adapter.complete(SPEC, user(10), [])

    assert not isinstance(caught.value, ContextTooLong)
    assert message[:20] in str(caught.value)


@pytest.mark.parametrize("status", [429, 503])
def test_a_transient_status_is_retried_whatever_its_message(llm: FakeLLM, adapter: OpenAIAdapter, status: int) -> None:
    llm.script(*[Reply(status=status, error_message="context length exceeded")] * 3)
    with pytest.raises(ModelUnavailable, match="3 attempt"):
        adapter.complete(SPEC, user(10), [])
    assert len(llm.requests) == 3


def test_the_message_is_still_redacted_and_cut_but_the_figures_survive(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    words = "maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
    llm.script(Reply(status=400, error_message=f"{'padding ' * 80}{words}", echo_key=True))

    err = refusal(adapter)

    assert (err.limit_tokens, err.requested_tokens) == (8192, 9000)
    assert len(str(err)) < 600 and "9000" not in str(err)  # cut before the figures
    llm.script(Reply(status=400, error_message=words, echo_key=True))
    err = refusal(adapter)
    assert KEY not in str(err) and REDACTED in str(err)


def test_a_plain_text_error_body_is_recognised() -> None:
    err = context_error(400, "upstream: prompt is too long: 1,200 tokens > 1,000 maximum", "HTTP 400: …")
    assert err is not None and (err.limit_tokens, err.requested_tokens) == (1000, 1200)
    assert str(err) == "HTTP 400: …"
    assert context_error(400, "bad request", "HTTP 400: bad request") is None
    assert context_error(500, {"message": "context length exceeded"}, "m") is None
    assert context_error(500, {"message": "Oops", "code": "context_length_exceeded"}, "m") is not None


# -- in-stream error chunks --------------------------------------------------


@pytest.mark.parametrize(
    ("stream_error", "limit", "requested"),
    [
        pytest.param(
            (400, "This endpoint's maximum context length is 8192 tokens. However, you requested about 9000 tokens"),
            8192,
            9000,
            id="http-like-code",
        ),
        pytest.param((None, "prompt is too long: 210000 tokens > 200000 maximum"), 200000, 210000, id="no-code"),
        pytest.param(("context_length_exceeded", "Request too large"), None, None, id="code"),
        pytest.param(("invalid_request_error", "Context length exceeded"), None, None, id="string-code"),
    ],
)
def test_an_in_stream_error_chunk_is_recognised(
    llm: FakeLLM,
    adapter: OpenAIAdapter,
    stream_error: tuple[int | str | None, str],
    limit: int | None,
    requested: int | None,
) -> None:
    llm.script(Reply(stream_error=stream_error))

    err = refusal(adapter)

    assert (err.limit_tokens, err.requested_tokens) == (limit, requested)
    assert str(err).startswith("model provider error mid-stream: ")
    assert len(llm.requests) == 1


def test_an_in_stream_error_through_openrouters_metadata_raw(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(stream_error=(400, "Provider returned error"), error_raw=ANTHROPIC_RAW))
    err = refusal(adapter)
    assert (err.limit_tokens, err.requested_tokens) == (200000, 210000)


def test_an_in_stream_context_error_after_output_is_not_torn(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="partial answer", stream_error=(None, "context length exceeded")))
    deltas: list[str] = []
    with pytest.raises(ContextTooLong):
        adapter.complete(SPEC, user(10), [], deltas.append)
    assert deltas == ["partial ", "answer"]


def test_other_in_stream_errors_are_unchanged(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(stream_error=(None, "something odd")))
    with pytest.raises(ModelUnavailable) as caught:
        adapter.complete(SPEC, user(10), [])
    assert not isinstance(caught.value, ContextTooLong)

    llm.script(Reply(text="shown", stream_error=(502, "context length exceeded")))
    with pytest.raises(TornStream):  # a transient code is a transient failure, whatever its words
        adapter.complete(SPEC, user(10), [], lambda _: None)


# -- everywhere the adapter is used ------------------------------------------


def test_utility_requests_raise_it_too(llm: FakeLLM, settings: object) -> None:
    settings.TERRET_LLM_BASE_URL = llm.base_url  # type: ignore[attr-defined]
    llm.max_context_chars = 50

    with pytest.raises(ContextTooLong) as caught:
        complete_utility("openrouter/some-model", [{"role": "system", "content": "Summarise."}, *user(200)])

    assert caught.value.requested_tokens == (len("Summarise.") + 200) // 4
    assert len(llm.requests) == 1


def test_it_pickles_with_its_figures() -> None:
    err = pickle.loads(pickle.dumps(ContextTooLong("too long", limit_tokens=8192, requested_tokens=9000)))
    assert (str(err), err.limit_tokens, err.requested_tokens) == ("too long", 8192, 9000)
    assert isinstance(err, ModelRejected) and not err.transient
