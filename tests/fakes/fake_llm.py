"""A local OpenAI-compatible chat completions server speaking the real SSE wire format.

Tests and benchmarks talk to it over HTTP exactly as the adapter talks to
OpenRouter; nothing is patched. Replies come from a FIFO script, then from a
responder callable.

    with FakeLLM() as llm:
        llm.script(Reply(text="hello"), Reply(tool_calls=[("clock.now", {})]))
        OpenAIAdapter(base_url=llm.base_url).complete(...)

A context window can be enforced: with `max_context_chars` set, a request
larger than that (see `request_size`) gets a context-length refusal instead
of a reply, and no scripted reply is used up. `refusal` picks the provider's
wording (REFUSALS): OpenAI's with figures (the default), OpenAI's naming no
figures, Anthropic's, OpenRouter's, or a bare `context_length_exceeded` code.

    llm = FakeLLM(max_context_chars=4000, refusal="bare")

Standalone (benchmarks, worker subprocesses):

    python -m tests.fakes.fake_llm --port 8765 --latency 1.0 --mode tool-then-final --tool debug.noop
    python -m tests.fakes.fake_llm --max-context 40000 --refusal anthropic
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a file (`python tests/fakes/fake_llm.py`, as the docs and briefs
    # start it), the repository root is not on sys.path as it is under -m.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sessions_app.llm.openai import to_wire  # noqa: E402

MODES = ("final", "tool-then-final", "always-tool")
CONTEXT_CODE = "context_length_exceeded"
# Seconds between the comments of a `keepalive_forever` reply.
KEEPALIVE_INTERVAL = 0.2
# Texts longer than this go out in BIG_PIECE-character chunks, not word by word.
BIG_TEXT = 64 * 1024
BIG_PIECE = 16 * 1024


@dataclass
class Reply:
    """One scripted completion.

    tool_calls: (Terret tool name, arguments) pairs; names are sent in wire form.
    usage: (prompt_tokens, completion_tokens, cost or None); None sends no usage chunk.
    latency: seconds before the first byte. chunk_delay: seconds between chunks.
    status: >= 400 answers with that HTTP error and a JSON error body (+ Retry-After):
      {"error": {"message": error_message, "type": error_type, "param": error_param,
      "code": error_code, "metadata": {"raw": error_raw}}}; `type`, `param` and
      `metadata` only when set, `code` the status when error_code is None.
    torn_after: close the connection after this many data chunks, without [DONE].
    omit_done: send every chunk and end the body cleanly, but never send [DONE].
    hang: True (until the server stops) or an Event (until set, then the stream
      goes on) to block right after the first text chunk.
    comments: `: OPENROUTER PROCESSING` keep-alive lines sent before the first chunk.
    multiline: spread each chunk's JSON over several `data:` lines.
    stream_error: (code, message) sent OpenRouter-style as an `error` chunk after
      the text, ending the stream there (code None: the error object has no
      `code`; error_type and error_raw apply to it too).
    keepalive_forever: after `keepalive_after` data chunks (0: before the first;
      len(chunks_for(reply)) or more: after the last, instead of [DONE]), send
      only `: OPENROUTER PROCESSING` comments, one every KEEPALIVE_INTERVAL
      seconds, until the client hangs up or the server stops.
    keepalive_until: an Event: after `keepalive_after` data chunks, send only
      `: keep-alive` comments, one every KEEPALIVE_INTERVAL seconds, until it
      is set; then the stream goes on (a provider that trickles keep-alives
      and then resumes).
    piece_size: send the text in pieces of this many characters instead of one
      word per chunk (texts over BIG_TEXT characters use BIG_PIECE by default).
    echo_key: an error reply's message ends with the Authorization header the
      request carried, as a careless provider would echo it.
    error_body: with `status`, the JSON body sent as it is, instead of the
      one built from the error_* fields (a provider's own shape).
    """

    text: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    usage: tuple[int, int, float | None] | None = (10, 5, None)
    latency: float = 0.0
    chunk_delay: float = 0.0
    status: int = 200
    retry_after: float | str | None = None
    error_message: str = "fake provider error"
    error_code: int | str | None = None
    error_type: str | None = None
    error_param: str | None = None
    error_raw: str | None = None
    torn_after: int | None = None
    omit_done: bool = False
    hang: bool | threading.Event = False
    comments: int = 1
    multiline: bool = False
    stream_error: tuple[int | str | None, str] | None = None
    keepalive_forever: bool = False
    keepalive_after: int = 0
    keepalive_until: threading.Event | None = None
    piece_size: int | None = None
    echo_key: bool = False
    error_body: dict[str, Any] | None = None


Responder = Callable[[dict[str, Any]], Reply]


def request_size(body: dict[str, Any]) -> int:
    """What `max_context_chars` is compared with: the characters of every
    message's `content` (a string, or the `text` of each text part of a list)
    plus the function name and arguments of every tool call in the messages.
    Roles, ids, the tool definitions and the rest of the body do not count."""
    size = 0
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            size += len(content)
        elif isinstance(content, list):
            size += sum(len(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            size += len(function.get("name") or "") + len(function.get("arguments") or "")
    return size


# How each provider says a request is over the context window (4 characters a token).
REFUSALS = ("openai", "openai-no-figures", "anthropic", "openrouter", "bare")


def context_refusal(size: int, max_chars: int, wording: str = "openai") -> Reply:
    """A provider's answer to a request of `size` characters over a window of
    `max_chars`, in one of the REFUSALS' words, as each sends it:

    - openai: 400, code context_length_exceeded, the limit and the request's
      size in the message (chat completions);
    - openai-no-figures: the same code, a message naming no figures (OpenAI's
      Responses API words);
    - anthropic: 400 `{"type": "error", "error": {"type":
      "invalid_request_error", "message": "prompt is too long: N tokens > M
      maximum"}}`, no code;
    - openrouter: 400 with an HTTP-like numeric code and its endpoint wording;
    - bare: 400 `{"error": {"code": "context_length_exceeded"}}`, no message."""
    limit, tokens = max_chars // 4, size // 4
    if wording == "openai":
        message = (
            f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
            f"{tokens} tokens. Please reduce the length of the messages."
        )
        return Reply(
            status=400,
            error_message=message,
            error_type="invalid_request_error",
            error_param="messages",
            error_code="context_length_exceeded",
        )
    if wording == "openai-no-figures":
        message = "Your input exceeds the context window of this model. Please adjust your input and try again."
        return Reply(status=400, error_message=message, error_type="invalid_request_error", error_code=CONTEXT_CODE)
    if wording == "anthropic":
        error = {"type": "invalid_request_error", "message": f"prompt is too long: {tokens} tokens > {limit} maximum"}
        return Reply(status=400, error_body={"type": "error", "error": error})
    if wording == "openrouter":
        message = (
            f"This endpoint's maximum context length is {limit} tokens. However, you requested about {tokens} "
            f"tokens ({tokens} of text input, 0 in the output). Please reduce the length of either one, or use "
            'the "middle-out" transform to compress your prompt automatically.'
        )
        return Reply(status=400, error_message=message, error_code=400)
    if wording == "bare":
        return Reply(status=400, error_body={"error": {"code": CONTEXT_CODE}})
    raise ValueError(f"unknown refusal wording {wording!r}; expected one of {REFUSALS}")


def _last_role(body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    return messages[-1].get("role") if messages else None


def responder_for_mode(
    mode: str,
    tool: str = "debug.noop",
    args: dict[str, Any] | None = None,
    latency: float = 0.0,
    chunk_delay: float = 0.0,
) -> Responder:
    """final: always text. tool-then-final: a user message gets a call to `tool`,
    a tool result gets text. always-tool: call `tool` every time."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    call = [(tool, dict(args or {}))]

    def respond(body: dict[str, Any]) -> Reply:
        if mode == "always-tool" or (mode == "tool-then-final" and _last_role(body) == "user"):
            return Reply(tool_calls=list(call), latency=latency, chunk_delay=chunk_delay)
        text = "done" if _last_role(body) == "tool" else "ok"
        return Reply(text=text, latency=latency, chunk_delay=chunk_delay)

    return respond


# -- wire format ------------------------------------------------------------


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _text_pieces(reply: Reply) -> list[str]:
    text = reply.text or ""
    size = reply.piece_size or (BIG_PIECE if len(text) > BIG_TEXT else None)
    if size:
        return _pieces(text, size)
    return re.findall(r"\s*\S+\s*", text) or [text]


def _choice(delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
    return [{"index": 0, "delta": delta, "finish_reason": finish}]


def _tool_call_deltas(tool_calls: list[tuple[str, dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    for index, (name, args) in enumerate(tool_calls):
        head = {"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
        yield {**head, "function": {"name": to_wire(name), "arguments": ""}}
        encoded = json.dumps(args)
        # At least two fragments, so assembly is always exercised.
        for piece in _pieces(encoded, max(1, min(7, len(encoded) // 2))):
            yield {"index": index, "function": {"arguments": piece}}


def chunks_for(reply: Reply) -> list[dict[str, Any]]:
    """The `choices`/`usage` part of each chunk, in order (without [DONE])."""
    chunks: list[dict[str, Any]] = [{"choices": _choice({"role": "assistant", "content": ""})}]
    if reply.text:
        chunks += [{"choices": _choice({"content": piece})} for piece in _text_pieces(reply)]
    if reply.stream_error is not None:
        code, message = reply.stream_error
        error = _error_object(reply, message, code)
        return [*chunks, {"error": error, "choices": _choice({}, "error")}]
    chunks += [{"choices": _choice({"tool_calls": [d]})} for d in _tool_call_deltas(reply.tool_calls)]
    chunks.append({"choices": _choice({}, "tool_calls" if reply.tool_calls else "stop")})
    if reply.usage is not None:
        prompt, completion, cost = reply.usage
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
        usage["total_tokens"] = prompt + completion
        if cost is not None:
            usage["cost"] = cost
        chunks.append({"choices": [], "usage": usage})
    return chunks


def _error_object(reply: Reply, message: str, code: int | str | None) -> dict[str, Any]:
    error: dict[str, Any] = {"message": message}
    if reply.error_type is not None:
        error["type"] = reply.error_type
    if reply.error_param is not None:
        error["param"] = reply.error_param
    if code is not None:
        error["code"] = code
    if reply.error_raw is not None:
        error["metadata"] = {"raw": reply.error_raw, "provider_name": "Fake"}
    return error


def _sse(payload: dict[str, Any], multiline: bool) -> str:
    if not multiline:
        return f"data: {json.dumps(payload)}\n\n"
    lines = json.dumps(payload, indent=1).splitlines()
    return "".join(f"data: {line}\n" for line in lines) + "\n"


# -- server -----------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The default backlog of 5 drops connections when 200 streams open at once.
    request_queue_size = 1024
    fake: FakeLLM

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up on keep-alive connections is normal; anything else is a bug worth printing.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Aborted(Exception):
    """The stream must end now, without its terminator."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the adapter's pooled client expects
    # Small SSE writes must not wait for delayed ACKs (~40 ms each).
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._track(self.connection, False)

    def do_POST(self) -> None:
        fake = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send_json(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        body = json.loads(raw or b"{}")
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = fake._next_reply(body, headers)
        try:
            if reply.latency and fake._stopped.wait(reply.latency):
                raise _Aborted
            if reply.status >= 400:
                self._send_error(reply, headers.get("authorization", ""))
            else:
                self._stream(reply, body.get("model") or "fake/model")
        except (_Aborted, OSError):
            self.close_connection = True

    def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, reply: Reply, authorization: str) -> None:
        headers = {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else {}
        if reply.error_body is not None:
            self._send_json(reply.status, reply.error_body, headers)
            return
        message = f"{reply.error_message} (you sent {authorization!r})" if reply.echo_key else reply.error_message
        code = reply.error_code if reply.error_code is not None else reply.status
        self._send_json(reply.status, {"error": _error_object(reply, message, code)}, headers)

    def _write_chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _stream(self, reply: Reply, model: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(reply.comments):
            self._write_chunk(": OPENROUTER PROCESSING\n\n")
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk", "model": model}
        chunks = chunks_for(reply)
        for n, chunk in enumerate(chunks):
            if reply.keepalive_forever and n == reply.keepalive_after:
                self._keep_alive_forever()
            if reply.keepalive_until is not None and n == reply.keepalive_after:
                self._keep_alive_until(reply.keepalive_until)
            self._before_chunk(reply, n)
            self._write_chunk(_sse({**base, "created": int(time.time()), **chunk}, reply.multiline))
            if chunk.get("usage"):
                self.server.fake._count_usage(chunk["usage"])
        if reply.keepalive_forever and reply.keepalive_after >= len(chunks):
            self._keep_alive_forever()  # every chunk sent, usage too, but never [DONE]
        if not reply.omit_done and reply.stream_error is None:
            self._write_chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _keep_alive_forever(self) -> None:
        fake = self.server.fake
        while not fake._stopped.wait(KEEPALIVE_INTERVAL):
            self._write_chunk(": OPENROUTER PROCESSING\n\n")  # raises OSError once the client is gone
            fake._count_keepalive()
        raise _Aborted

    def _keep_alive_until(self, resume: threading.Event) -> None:
        fake = self.server.fake
        while not resume.wait(KEEPALIVE_INTERVAL):
            if fake._stopped.is_set():
                raise _Aborted
            self._write_chunk(": keep-alive\n\n")  # raises OSError once the client is gone
            fake._count_keepalive()

    def _before_chunk(self, reply: Reply, n: int) -> None:
        stopped = self.server.fake._stopped
        if reply.torn_after is not None and n >= reply.torn_after:
            raise _Aborted
        if n == 2 and reply.hang and not self._wait_hang(reply.hang):
            raise _Aborted
        if n and reply.chunk_delay and stopped.wait(reply.chunk_delay):
            raise _Aborted

    def _wait_hang(self, hang: bool | threading.Event) -> bool:
        """True when released by the Event, False when the server stopped."""
        stopped = self.server.fake._stopped
        if not isinstance(hang, threading.Event):
            stopped.wait()
            return False
        while not hang.wait(0.05):
            if stopped.is_set():
                return False
        return True


class FakeLLM:
    """The server. `base_url` (e.g. http://127.0.0.1:PORT/v1) goes where
    TERRET_LLM_BASE_URL would; `requests` holds every request body received.

    `max_context_chars` (None: no limit; tests may change it while the server
    runs) is the context window: a request whose `request_size` exceeds it is
    answered at once with HTTP 400 and a context-length refusal in the words
    `refusal` names (context_refusal; figures in tokens of 4 characters), and
    the script is left untouched.
    `requests` still counts it; `refused` holds such requests and `accepted`
    the others (answered by the script or the responder, errors included),
    each in arrival order."""

    def __init__(
        self,
        responder: Responder | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_context_chars: int | None = None,
        refusal: str = "openai",
    ) -> None:
        if refusal not in REFUSALS:
            raise ValueError(f"unknown refusal wording {refusal!r}; expected one of {REFUSALS}")
        self.responder: Responder = responder or responder_for_mode("final")
        self.max_context_chars = max_context_chars
        self.refusal = refusal
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._script: deque[Reply] = deque()
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        self._accepted: list[dict[str, Any]] = []
        self._refused: list[dict[str, Any]] = []
        self._connections: set[socket.socket] = set()
        self.connections_opened = 0  # TCP connections accepted so far (keep-alive reuse shows here)
        self.keepalives_sent = 0  # comments sent by `keepalive_forever` replies
        self.usage_sent: list[dict[str, Any]] = []  # every usage chunk written in full, in order
        self._stopped = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeLLM is not started")
        host, port = self._server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host  # an AF_INET address: always str
        return f"http://{name}:{port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    @property
    def accepted(self) -> list[dict[str, Any]]:
        """The requests within `max_context_chars`, answered as scripted."""
        with self._lock:
            return list(self._accepted)

    @property
    def refused(self) -> list[dict[str, Any]]:
        """The requests refused for exceeding `max_context_chars`."""
        with self._lock:
            return list(self._refused)

    @property
    def headers(self) -> list[dict[str, str]]:
        """Request headers (lower-cased names), parallel to `requests`."""
        with self._lock:
            return list(self._headers)

    def script(self, *replies: Reply) -> FakeLLM:
        with self._lock:
            self._script.extend(replies)
        return self

    def start(self) -> FakeLLM:
        self._server = _Server((self._host, self._port), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving and cuts every open connection, releasing hung streams."""
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
                self.connections_opened += 1
            else:
                self._connections.discard(conn)

    def _count_usage(self, usage: dict[str, Any]) -> None:
        with self._lock:
            self.usage_sent.append(dict(usage))

    @property
    def tokens_sent(self) -> int:
        """Tokens this server reported spending, in the usage chunks it wrote
        in full: what a provider would bill, the audit's other side."""
        with self._lock:
            return sum(u["prompt_tokens"] + u["completion_tokens"] for u in self.usage_sent)

    def _count_keepalive(self) -> None:
        with self._lock:
            self.keepalives_sent += 1

    def _next_reply(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        limit, size = self.max_context_chars, request_size(body)
        with self._lock:
            self._requests.append(body)
            self._headers.append(headers)
            if limit is not None and size > limit:
                self._refused.append(body)
                return context_refusal(size, limit, self.refusal)
            self._accepted.append(body)
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            return scripted
        try:
            return self.responder(body)
        except Exception as err:  # a broken responder should fail the request, not the server
            return Reply(status=500, error_message=f"responder failed: {err!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible SSE server for tests and benchmarks")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before the first byte")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--mode", choices=MODES, default="final")
    parser.add_argument("--tool", default="debug.noop", help="Terret tool name the tool modes call")
    parser.add_argument("--args", default="{}", help="JSON arguments for the tool call")
    parser.add_argument(
        "--max-context",
        type=int,
        default=None,
        metavar="CHARS",
        help="refuse requests larger than this many characters with a context-length error",
    )
    parser.add_argument("--refusal", choices=REFUSALS, default="openai", help="the context-length error's wording")
    opts = parser.parse_args(argv)
    responder = responder_for_mode(opts.mode, opts.tool, json.loads(opts.args), opts.latency, opts.chunk_delay)
    llm = FakeLLM(
        responder, host=opts.host, port=opts.port, max_context_chars=opts.max_context, refusal=opts.refusal
    ).start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # The base URL alone on the first line, so scripts can read it.
    print(llm.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        llm.stop()


if __name__ == "__main__":
    main()
