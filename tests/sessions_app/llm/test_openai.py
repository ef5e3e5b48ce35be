"""The OpenAI-compatible adapter against FakeLLM, over real HTTP."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx
import pytest

from sessions_app.llm.openai import OpenAIAdapter, from_wire, iter_lines, iter_sse_data, to_wire
from sessions_app.llm.registry import complete_utility, get_adapter
from sessions_app.llm.types import ModelNotConfigured, ModelRejected, ModelUnavailable, ToolSpec, TornStream, Usage
from tests.fakes.fake_llm import FakeLLM, Reply, chunks_for

SPEC = "test/model"
USER = [{"role": "user", "content": "hi"}]
WIRE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


@pytest.fixture
def adapter(llm: FakeLLM) -> OpenAIAdapter:
    return OpenAIAdapter(base_url=llm.base_url, api_key="test-key", timeout=5.0, retries=2, backoff_base=0.0)


def tool(name: str) -> ToolSpec:
    return ToolSpec(name=name, description=f"the {name} tool", parameters={"type": "object", "properties": {}})


# -- streaming and assembly -------------------------------------------------


def test_text_streams_deltas_in_order(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="Hello there, general Kenobi"))
    deltas: list[str] = []

    reply = adapter.complete(SPEC, USER, [], deltas.append)

    assert deltas == ["Hello ", "there, ", "general ", "Kenobi"]
    assert reply.content == "Hello there, general Kenobi"
    assert reply.tool_calls == []
    assert reply.finish_reason == "stop"


def test_request_body_and_auth(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    adapter.complete(SPEC, USER, [])

    body = llm.requests[0]
    assert body["model"] == SPEC
    assert body["messages"] == USER
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["usage"] == {"include": True}
    assert "tools" not in body
    assert llm.headers[0]["authorization"] == "Bearer test-key"


def test_no_authorization_header_without_key(llm: FakeLLM) -> None:
    keyless = OpenAIAdapter(base_url=llm.base_url, api_key="", retries=0)
    assert keyless.complete(SPEC, USER, []).content == "ok"
    assert "authorization" not in llm.headers[0]


def test_parallel_tool_calls_assembled_from_fragments(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    write_args = {"path": "notes/a.txt", "content": "several words of content"}
    reply_spec = Reply(tool_calls=[("workspace.write", write_args), ("mcp.time.get_current_time", {"tz": "UTC"})])
    arg_fragments = [c for c in chunks_for(reply_spec) if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
    assert len(arg_fragments) > 4  # the wire really splits the arguments
    llm.script(reply_spec)
    deltas: list[str] = []

    reply = adapter.complete(SPEC, USER, [tool("workspace.write"), tool("mcp.time.get_current_time")], deltas.append)

    assert [c.name for c in reply.tool_calls] == ["workspace.write", "mcp.time.get_current_time"]
    assert json.loads(reply.tool_calls[0].arguments) == write_args
    assert json.loads(reply.tool_calls[1].arguments) == {"tz": "UTC"}
    assert len({c.id for c in reply.tool_calls}) == 2
    assert all(c.id.startswith("call_") for c in reply.tool_calls)
    assert reply.content is None
    assert reply.finish_reason == "tool_calls"
    assert deltas == []


def test_text_and_tool_call_in_one_reply(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="Let me check.", tool_calls=[("clock.now", {})]))
    reply = adapter.complete(SPEC, USER, [tool("clock.now")])
    assert reply.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("clock.now", {})]


def test_usage_and_cost_from_final_chunk(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="a", usage=(120, 30, 0.00042)), Reply(text="b", usage=(7, 3, None)), Reply(usage=None))

    assert adapter.complete(SPEC, USER, []).usage == Usage(120, 30, 0.00042)
    assert adapter.complete(SPEC, USER, []).usage == Usage(7, 3, None)
    assert adapter.complete(SPEC, USER, []).usage is None


# -- tool name mapping ------------------------------------------------------


def test_tool_names_are_mapped_on_the_wire_both_ways(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    history = [
        {"role": "user", "content": "what time is it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "clock.now", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    snapshot = json.dumps(history)
    llm.script(Reply(tool_calls=[("mcp.time.get_current_time", {})]))

    reply = adapter.complete(SPEC, history, [tool("workspace.write"), tool("mcp.time.get_current_time")])

    body = llm.requests[0]
    assert [t["function"]["name"] for t in body["tools"]] == ["workspace__write", "mcp__time__get_current_time"]
    assert body["tools"][0]["function"]["description"] == "the workspace.write tool"
    assert body["messages"][1]["tool_calls"][0]["function"]["name"] == "clock__now"
    assert reply.tool_calls[0].name == "mcp.time.get_current_time"
    assert json.dumps(history) == snapshot  # the caller's messages are not mutated


@pytest.mark.parametrize(
    "name",
    ["workspace.write", "mcp.time.get_current_time", "a-b_c", "mcp.some server.do/thing", "odd__name", "x." * 40],
)
def test_wire_names_are_valid_and_reversible(name: str) -> None:
    wire = to_wire(name)
    assert WIRE_NAME.match(wire)
    assert to_wire(name) == wire  # stable, so history and tools agree
    assert from_wire(wire, {wire: name}) == name


def test_simple_names_reverse_without_the_offered_tools() -> None:
    assert from_wire(to_wire("mcp.time.get_current_time")) == "mcp.time.get_current_time"


# -- SSE parsing ------------------------------------------------------------


def test_sse_parser_handles_comments_fields_and_multiline_data() -> None:
    lines = [": OPENROUTER PROCESSING", "", "event: message", "id: 1", 'data: {"a":', "data:  1}", "", "data: [DONE]"]
    assert list(iter_sse_data(lines)) == ['{"a":\n 1}', "[DONE]"]


def test_sse_comment_lines_are_on_the_wire_and_ignored(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="raw", comments=3), Reply(text="hi there", comments=3))
    raw = httpx.post(f"{llm.base_url}/chat/completions", json={"model": SPEC, "messages": USER}).text
    assert raw.count(": OPENROUTER PROCESSING\n") == 3

    assert adapter.complete(SPEC, USER, []).content == "hi there"


def test_multiline_events_are_joined(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    reply_spec = Reply(text="multi line", tool_calls=[("clock.now", {"fmt": "iso"})], usage=(5, 6, 0.5), multiline=True)
    llm.script(reply_spec, reply_spec)
    raw = httpx.post(f"{llm.base_url}/chat/completions", json={"model": SPEC, "messages": USER}).text
    assert re.search(r"^data: \{\ndata: ", raw, re.MULTILINE)

    reply = adapter.complete(SPEC, USER, [tool("clock.now")])
    assert reply.content == "multi line"
    assert json.loads(reply.tool_calls[0].arguments) == {"fmt": "iso"}
    assert reply.usage == Usage(5, 6, 0.5)


# -- retries and failures ---------------------------------------------------


def test_429_honours_retry_after_then_succeeds(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(status=429, retry_after=1), Reply(text="fine"))
    started = time.monotonic()

    reply = adapter.complete(SPEC, USER, [])

    assert reply.content == "fine"
    assert len(llm.requests) == 2
    assert time.monotonic() - started >= 0.95  # backoff base is 0, so only Retry-After explains the wait


def test_5xx_is_retried_then_succeeds(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(status=500), Reply(status=503), Reply(text="recovered"))
    assert adapter.complete(SPEC, USER, []).content == "recovered"
    assert len(llm.requests) == 3


def test_retries_exhausted_raise_model_unavailable(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(*[Reply(status=502, error_message="upstream is down")] * 4)

    with pytest.raises(ModelUnavailable, match=r"3 attempt.*HTTP 502.*upstream is down"):
        adapter.complete(SPEC, USER, [])
    assert len(llm.requests) == 3  # 1 + retries=2


def test_4xx_is_not_retried_and_carries_the_provider_message(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(status=400, error_message="test/model is not a valid model ID"))

    with pytest.raises(ModelRejected, match="HTTP 400.*is not a valid model ID"):
        adapter.complete(SPEC, USER, [])
    assert len(llm.requests) == 1


def test_excessive_retry_after_fails_fast(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(status=429, retry_after=3600))
    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match="retry after 3600s"):
        adapter.complete(SPEC, USER, [])
    assert time.monotonic() - started < 2
    assert len(llm.requests) == 1


def test_torn_stream_after_output_raises_without_retry(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="one two three four five", torn_after=3), Reply(text="never sent"))
    deltas: list[str] = []

    with pytest.raises(TornStream, match=r"\[DONE\]"):
        adapter.complete(SPEC, USER, [], deltas.append)
    assert deltas == ["one ", "two "]
    assert len(llm.requests) == 1


def test_clean_eof_without_done_is_torn(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="almost finished", omit_done=True))
    deltas: list[str] = []
    with pytest.raises(TornStream, match=r"closed before \[DONE\]"):
        adapter.complete(SPEC, USER, [], deltas.append)
    assert "".join(deltas) == "almost finished"


def test_torn_stream_before_any_output_is_retried(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(tool_calls=[("clock.now", {})], torn_after=2), Reply(text="second try"))
    deltas: list[str] = []

    reply = adapter.complete(SPEC, USER, [tool("clock.now")], deltas.append)

    assert reply.content == "second try"
    assert deltas == ["second ", "try"]  # nothing from the torn attempt leaked
    assert len(llm.requests) == 2


def test_torn_streams_exhaust_retries_as_unavailable(llm: FakeLLM) -> None:
    once = OpenAIAdapter(base_url=llm.base_url, retries=1, backoff_base=0.0)
    llm.script(Reply(text="x", omit_done=True), Reply(text="y", omit_done=True))
    with pytest.raises(ModelUnavailable, match=r"2 attempt.*\[DONE\]"):
        once.complete(SPEC, USER, [])  # no on_delta: nothing was shown, so both were retryable
    assert len(llm.requests) == 2


def test_mid_stream_error_chunk_is_retried_when_transient(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(stream_error=(502, "upstream overloaded")), Reply(text="recovered"))
    assert adapter.complete(SPEC, USER, [], lambda _: None).content == "recovered"
    assert len(llm.requests) == 2


def test_mid_stream_error_chunk_is_final_when_permanent(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(stream_error=(400, "context length exceeded")))
    with pytest.raises(ModelRejected, match="mid-stream: context length exceeded"):
        adapter.complete(SPEC, USER, [])
    assert len(llm.requests) == 1


def test_mid_stream_error_after_output_is_torn(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="partial answer", stream_error=(503, "provider went away")))
    deltas: list[str] = []
    with pytest.raises(TornStream, match="provider went away"):
        adapter.complete(SPEC, USER, [], deltas.append)
    assert deltas == ["partial ", "answer"]
    assert len(llm.requests) == 1


def test_read_timeout_is_retried_then_succeeds(llm: FakeLLM) -> None:
    impatient = OpenAIAdapter(base_url=llm.base_url, timeout=0.3, retries=1, backoff_base=0.0)
    llm.script(Reply(text="too slow", latency=2.0), Reply(text="fast"))
    assert impatient.complete(SPEC, USER, []).content == "fast"
    assert len(llm.requests) == 2


def test_read_timeouts_exhaust_retries(llm: FakeLLM) -> None:
    impatient = OpenAIAdapter(base_url=llm.base_url, timeout=0.3, retries=1, backoff_base=0.0)
    llm.script(Reply(latency=2.0), Reply(latency=2.0))
    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match="timed out"):
        impatient.complete(SPEC, USER, [])
    assert time.monotonic() - started < 1.9
    assert len(llm.requests) == 2


def test_mid_stream_stall_after_output_is_torn(llm: FakeLLM) -> None:
    impatient = OpenAIAdapter(base_url=llm.base_url, timeout=0.3, retries=2, backoff_base=0.0)
    release = threading.Event()
    llm.script(Reply(text="first then nothing", hang=release))
    deltas: list[str] = []
    try:
        with pytest.raises(TornStream, match="stream torn.*ReadTimeout"):
            impatient.complete(SPEC, USER, [], deltas.append)
    finally:
        release.set()
    assert deltas == ["first "]
    assert len(llm.requests) == 1


def test_hung_stream_is_cut_when_the_server_stops(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.script(Reply(text="stuck here forever", hang=True))
    deltas: list[str] = []
    errors: list[Exception] = []

    def run() -> None:
        try:
            adapter.complete(SPEC, USER, [], deltas.append)
        except Exception as err:
            errors.append(err)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 5
    while not deltas and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.is_alive()  # hanging, not finished
    llm.stop()
    worker.join(timeout=5)

    assert deltas == ["stuck "]
    assert len(errors) == 1 and isinstance(errors[0], TornStream)


def test_connection_refused_is_unavailable() -> None:
    with FakeLLM() as gone:
        url = gone.base_url
    dead = OpenAIAdapter(base_url=url, retries=1, backoff_base=0.0)
    with pytest.raises(ModelUnavailable, match="connection failed"):
        dead.complete(SPEC, USER, [])


# -- concurrency, settings and the registry ---------------------------------


def test_many_concurrent_streams_run_at_once(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    llm.responder = lambda body: Reply(text=f"reply to {body['messages'][0]['content']}", latency=0.5)
    results: dict[int, str | None] = {}

    def run(i: int) -> None:
        results[i] = adapter.complete(SPEC, [{"role": "user", "content": str(i)}], []).content

    threads = [threading.Thread(target=run, args=(i,)) for i in range(200)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert results == {i: f"reply to {i}" for i in range(200)}
    assert time.monotonic() - started < 10  # concurrent, not 200 x 0.5 s


def test_standalone_server_modes() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.fake_llm", "--mode", "tool-then-final", "--tool", "clock.now"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", base_url)
        standalone = OpenAIAdapter(base_url=base_url, retries=0)

        first = standalone.complete(SPEC, USER, [tool("clock.now")])
        assert [c.name for c in first.tool_calls] == ["clock.now"]
        result = {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "12:00"}
        second = standalone.complete(SPEC, [*USER, {"role": "assistant", "content": None}, result], [])
        assert second.content == "done"
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0


def test_registry_reads_settings_and_runs_utility_requests(llm: FakeLLM, settings: object) -> None:
    settings.TERRET_LLM_BASE_URL = llm.base_url  # type: ignore[attr-defined]
    settings.TERRET_LLM_API_KEY = "from-settings"  # type: ignore[attr-defined]
    llm.script(Reply(text="A short title"))

    reply = complete_utility("openrouter/some-model", [{"role": "system", "content": "Title this."}, *USER])

    assert reply.content == "A short title"
    assert llm.requests[0]["model"] == "openrouter/some-model"
    assert "tools" not in llm.requests[0]
    assert llm.headers[0]["authorization"] == "Bearer from-settings"


def test_registry_picks_singleton_adapters() -> None:
    assert isinstance(get_adapter("openai/gpt-4o"), OpenAIAdapter)
    assert get_adapter("openai/gpt-4o") is get_adapter("anthropic/claude-sonnet-4")
    assert not isinstance(get_adapter("demo/offline"), OpenAIAdapter)
    with pytest.raises(ModelNotConfigured):
        get_adapter("")


def test_sequential_calls_reuse_one_connection(llm: FakeLLM, adapter: OpenAIAdapter) -> None:
    """The body after [DONE] is drained, so the pooled connection is reused
    instead of a new TCP connection per model call."""
    llm.script(Reply(text="one"), Reply(tool_calls=[("clock.now", {})]), Reply(text="three"))
    for _ in range(3):
        adapter.complete("m", [{"role": "user", "content": "hi"}], [tool("clock.now")])
    assert len(llm.requests) == 3
    assert llm.connections_opened == 1


def test_each_thread_keeps_its_own_pool_with_one_tls_context() -> None:
    from sessions_app.llm.openai import shared_pool, tls_context

    url = httpcore.URL("http://127.0.0.1:9/v1/chat/completions")
    mine = shared_pool(url)
    assert shared_pool(url) is mine  # kept for the thread's next call
    assert shared_pool(httpcore.URL("http://127.0.0.2:9/v1")) is not mine  # one per origin
    theirs: list[httpcore.ConnectionPool] = []
    t = threading.Thread(target=lambda: theirs.append(shared_pool(url)))
    t.start()
    t.join()
    assert theirs[0] is not mine
    assert tls_context() is tls_context()


@pytest.mark.parametrize(
    "chunks",
    [
        [b"data: a\r", b"\ndata: b\r\n\r\n"],  # a CRLF split across chunks is one line end
        [b"data: a\n\n", b"data: b"],  # an unterminated last line still counts
        [b"da", b"ta: \xc3", b"\xa9\n", b"\n"],  # a UTF-8 character split across chunks
        [b"a\rb\r", b"\r\n"],  # CR alone ends a line too
        [b"", b": keep-alive\n", b"", b"\n"],
    ],
)
def test_iter_lines_splits_as_sse_does(chunks: list[bytes]) -> None:
    assert list(iter_lines(chunks)) == b"".join(chunks).decode().splitlines()


# -- the proxy from the environment (as httpx's trust_env read it) ----------


class _AnsweringProxy:
    """A forward proxy that answers every request itself with a one-chunk SSE
    reply, and records each request line it was sent."""

    def __init__(self) -> None:
        import socket

        self.lines: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                raw = b""
                while b"\r\n\r\n" not in raw:
                    raw += conn.recv(65536)
                head, _, rest = raw.partition(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.lines.append(head.split(b"\r\n", 1)[0].decode())
                chunk = {"choices": [{"index": 0, "delta": {"content": "via proxy"}, "finish_reason": "stop"}]}
                body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

    def close(self) -> None:
        self.sock.close()


def _in_new_thread(fn: Any) -> Any:
    """Run `fn` in a thread of its own: pools are per thread and origin, and
    the proxy is read when a thread's pool for an origin is made."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    return out[0]


def test_model_calls_go_through_the_environments_proxy(llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = _AnsweringProxy()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        adapter = OpenAIAdapter(base_url=llm.base_url, api_key="k", timeout=5.0, retries=0)
        reply = _in_new_thread(lambda: adapter.complete("m", [{"role": "user", "content": "hi"}], []))
    finally:
        proxy.close()
    assert reply.content == "via proxy"
    # Absolute-form request line: the proxy was asked for the provider's URL.
    assert proxy.lines == [f"POST {llm.base_url.rstrip('/')}/chat/completions HTTP/1.1"]
    assert llm.requests == []  # nothing reached the provider directly


def test_no_proxy_sends_the_call_directly(llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = _AnsweringProxy()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        llm.script(Reply(text="direct"))
        adapter = OpenAIAdapter(base_url=llm.base_url, api_key="k", timeout=5.0, retries=0)
        reply = _in_new_thread(lambda: adapter.complete("m", [{"role": "user", "content": "hi"}], []))
    finally:
        proxy.close()
    assert reply.content == "direct"
    assert proxy.lines == []
    assert len(llm.requests) == 1


def test_a_base_url_that_is_not_http_is_a_configuration_error() -> None:
    adapter = OpenAIAdapter(base_url="ftp://example.invalid/v1", api_key="k", retries=0)
    with pytest.raises(ModelNotConfigured, match="http"):
        adapter.complete("m", [{"role": "user", "content": "hi"}], [])
