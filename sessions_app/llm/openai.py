"""OpenAI-compatible chat completions over SSE (OpenRouter by default).

Runs in Celery worker threads, up to a few hundred concurrent streams per
process; each thread keeps its own lazily created httpcore connection pool
(see shared_pool).
Settings are read at call time, so overrides (tests, `settings` fixture) apply
to the process-wide adapter singleton too.

Every call runs under an `Abort` (the caller's, or one of its own) with its
wall-clock deadline armed on the process-wide watchdog (llm/deadline.py).
httpcore cannot interrupt a blocked read, so while a call streams, the Abort
holds a hook that shuts the call's socket down: the read then returns at
once, whether the provider is silent or trickles keep-alive comments.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import json
import logging
import os
import random
import re
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx
from django.conf import settings

from sessions_app.llm import deadline
from sessions_app.llm.abort import DEADLINE, Abort
from sessions_app.llm.types import (
    ContextTooLong,
    DeltaSink,
    ModelError,
    ModelNotConfigured,
    ModelRejected,
    ModelReply,
    ModelUnavailable,
    ToolCall,
    ToolSpec,
    TornStream,
    Usage,
    for_model,
)

logger = logging.getLogger(__name__)

# First retry waits about this long, doubling each attempt up to the cap.
# A `TERRET_LLM_BACKOFF_BASE` setting overrides it (tests use 0).
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
# A provider asking for a longer pause than this gets a fast, explicit failure
# instead of pinning a worker thread for minutes.
MAX_RETRY_AFTER_SECONDS = 60.0
CONNECT_TIMEOUT_SECONDS = 15.0
# How much of the provider's own error message a ModelError carries.
PROVIDER_MESSAGE_LIMIT = 500

_WIRE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_WIRE_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


# -- tool name mapping ------------------------------------------------------


def from_wire(wire: str, known: Mapping[str, str] | None = None) -> str:
    """Terret's name for a wire function name. `known` (wire -> Terret, built
    from the tools that were offered) resolves hashed names exactly."""
    if known and wire in known:
        return known[wire]
    return wire.replace("__", ".")


def to_wire(name: str) -> str:
    """OpenAI function names must match ^[a-zA-Z0-9_-]{1,64}$; dots become `__`.

    Names that would not survive the round trip (too long, odd characters,
    a literal `__`) get a stable hashed form instead; `from_wire` resolves
    those through the offered tools."""
    wire = name.replace(".", "__")
    if _WIRE_NAME.match(wire) and from_wire(wire) == name:
        return wire
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{_WIRE_UNSAFE.sub('_', wire)[:54]}_h{digest}"


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    wired = [{**c, "function": {**c["function"], "name": to_wire(c["function"]["name"])}} for c in calls]
    return {**message, "tool_calls": wired}


def _wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages on the wire. Chat completions take images only
    in user messages, and a tool message must follow its assistant message
    with no other message between the results of one step; so the images of
    a run of tool results go in one user message right after the run, each
    introduced by the call it came from. Attachments that no one prepared
    (`llm.types.for_model`, which decides by the role's capability) are
    treated as for a text-only model: described, not sent."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, list[dict[str, Any]]]] = []
    for message in for_model(messages, images=False):
        if message.get("role") != "tool" and pending:
            out.append(_images_message(pending))
            pending = []
        images = message.get("images")
        if images:
            message = {k: v for k, v in message.items() if k != "images"}
            pending.append((str(message.get("tool_call_id") or ""), images))
        out.append(_wire_message(message))
    if pending:
        out.append(_images_message(pending))
    return out


def _images_message(results: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for call_id, images in results:
        parts.append({"type": "text", "text": f"The image(s) returned by tool call {call_id}, in order:"})
        for image in images:
            url = f"data:{image.get('mime_type') or 'image/png'};base64,{image.get('data') or ''}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


def _wire_tool(tool: ToolSpec) -> dict[str, Any]:
    function = {"name": to_wire(tool.name), "description": tool.description, "parameters": tool.parameters}
    return {"type": "function", "function": function}


# -- SSE --------------------------------------------------------------------


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Lines of a UTF-8 byte stream, split on LF, CRLF or CR as SSE allows.
    Cheaper than httpx's text and line decoders, which handle any charset;
    an event stream is UTF-8 by definition. A chunk ending in CR waits for
    the next one, so a CRLF split across chunks is one line end, not two."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        if pending.endswith(b"\r"):
            continue
        lines = pending.splitlines()
        if pending.endswith((b"\n", b"\r")):
            pending = b""
        else:
            pending = lines.pop() if lines else b""
        for line in lines:
            yield line.decode("utf-8", "replace")
    for line in pending.splitlines():
        yield line.decode("utf-8", "replace")


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The `data` payload of each server-sent event.

    Comment lines (`: OPENROUTER PROCESSING` keep-alives) and other fields are
    skipped; multi-line data is joined with newlines. An event still pending at
    EOF is yielded too, so a final `[DONE]` without its blank line counts and a
    truncated JSON payload surfaces as a parse error instead of vanishing."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value.removeprefix(" "))
    if data:
        yield "\n".join(data)


# -- stream assembly --------------------------------------------------------


@dataclass
class _CallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _StreamState:
    """What one attempt has received so far."""

    on_delta: DeltaSink | None
    text: list[str] = field(default_factory=list)
    calls: dict[int, _CallParts] = field(default_factory=dict)
    usage: Usage | None = None
    finish_reason: str | None = None
    emitted: bool = False

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = _parse_usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            self._feed_delta(choice.get("delta") or {})
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def _feed_delta(self, delta: dict[str, Any]) -> None:
        text = delta.get("content")
        if text:
            self.text.append(text)
            if self.on_delta is not None:
                self.emitted = True
                self.on_delta(text)
        for piece in delta.get("tool_calls") or []:
            self._feed_call(piece)

    def _feed_call(self, piece: dict[str, Any]) -> None:
        index = piece.get("index")
        if index is None:
            # Some gateways omit `index` and send whole calls; a new id starts a new call.
            index = len(self.calls) - 1 if self.calls and not piece.get("id") else len(self.calls)
        parts = self.calls.setdefault(index, _CallParts())
        parts.id = parts.id or piece.get("id") or ""
        function = piece.get("function") or {}
        name = function.get("name") or ""
        if name and name != parts.name:
            # Normally the whole name arrives once; tolerate both fragments and repeats.
            parts.name += name
        if function.get("arguments"):
            parts.arguments.append(function["arguments"])

    def partial(self) -> ModelReply:
        """What a stopped call had received: text and usage. Tool calls are
        dropped: a half-streamed call cannot be run."""
        return ModelReply(content="".join(self.text) or None, usage=self.usage)

    def reply(self, known: Mapping[str, str]) -> ModelReply:
        calls = [
            ToolCall(
                id=parts.id or f"call_{uuid.uuid4().hex[:24]}",
                name=from_wire(parts.name, known),
                # No-argument calls often stream no argument text at all.
                arguments="".join(parts.arguments) or "{}",
            )
            for _, parts in sorted(self.calls.items())
        ]
        content = "".join(self.text) or None
        return ModelReply(content=content, tool_calls=calls, usage=self.usage, finish_reason=self.finish_reason)


def _parse_usage(raw: dict[str, Any]) -> Usage:
    cost = raw.get("cost")
    return Usage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0),
        completion_tokens=int(raw.get("completion_tokens") or 0),
        cost=float(cost) if cost is not None else None,
    )


# -- errors -----------------------------------------------------------------

REDACTED = "[redacted]"
# Shorter "secrets" would blank ordinary words out of every message; real keys are far longer.
_MIN_SECRET_LENGTH = 8
_KEY_SHAPED = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}|\bAIza[0-9A-Za-z_-]{30,}")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]{8,}")
_KEY_FIELD = re.compile(r"(?i)\b((?:api[_-]?key|access[_-]?token|secret)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;]{6,}")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without credentials: every one of `secrets` (the configured API
    key) wherever it appears, and anything shaped like a key (`sk-…`,
    `sk-or-v1-…`, `AIza…`, `Bearer …`, `api_key=…`). Provider text goes
    through here before it reaches any exception, log line or event."""
    for secret in secrets:
        if len(secret) >= _MIN_SECRET_LENGTH:
            text = text.replace(secret, REDACTED)
    text = _KEY_SHAPED.sub(REDACTED, text)
    text = _BEARER.sub(rf"\1{REDACTED}", text)
    return _KEY_FIELD.sub(rf"\1{REDACTED}", text)


def _provider_text(raw: str, secrets: Iterable[str]) -> str:
    """The provider's words as a ModelError carries them: redacted, then cut
    (in that order, so a key cut in two cannot survive by halves)."""
    text = redact(raw, secrets).strip()
    if len(text) <= PROVIDER_MESSAGE_LIMIT:
        return text
    return text[:PROVIDER_MESSAGE_LIMIT].rstrip() + "…"


class _Transient(Exception):
    """A failure worth another attempt, unless output was already shown."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _error_text(error: dict[str, Any]) -> str:
    """An `error` object's message, with OpenRouter's `metadata.raw` (the
    upstream provider's own words) when it has one."""
    message = str(error.get("message") or json.dumps(error))
    metadata = error.get("metadata")
    raw = metadata.get("raw") if isinstance(metadata, dict) else None
    return f"{message} ({raw})" if isinstance(raw, str) and raw else message


def _provider_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return _error_text(error)
    if isinstance(error, str):
        return error
    return json.dumps(body)


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _retryable(status: int) -> bool:
    return status in (408, 429) or status >= 500


def _status_code(raw: Any) -> int | None:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.isdigit():
        return int(raw)
    return None


# -- context-length errors: recognised here and nowhere else ----------------

CONTEXT_LENGTH_CODE = "context_length_exceeded"
# Each pattern finds a context-length complaint in the provider's words; its
# named groups, when present, carry the figures.
_CONTEXT_PATTERNS = (
    # OpenAI: "This model's maximum context length is 8192 tokens. However, your
    # messages resulted in 9000 tokens"; OpenRouter, DeepSeek, vLLM: "This
    # endpoint's maximum context length is 8192 tokens. However, you requested
    # about 9000 tokens (…)" (also seen with ", however" and without "about").
    re.compile(
        r"maximum context length is (?P<limit>\d[\d,]*) tokens"
        r"(?:.{0,80}?(?:resulted in|requested(?: about)?) (?P<requested>\d[\d,]*) tokens)?",
        re.IGNORECASE | re.DOTALL,
    ),
    # Anthropic (directly, or through OpenRouter's metadata.raw):
    # "prompt is too long: 210000 tokens > 200000 maximum".
    re.compile(
        r"prompt is too long(?::\s*(?P<requested>\d[\d,]*) tokens\s*>\s*(?P<limit>\d[\d,]*) maximum)?",
        re.IGNORECASE,
    ),
    # Anywhere in the message: "context length exceeded", "context_length_exceeded".
    re.compile(r"context[ _-]length[ _-]exceeded", re.IGNORECASE),
)


def _tokens(raw: str | None) -> int | None:
    return int(raw.replace(",", "")) if raw else None


def _context_figures(text: str) -> tuple[int | None, int | None] | None:
    """(limit, requested) when `text` says the context length was exceeded."""
    for pattern in _CONTEXT_PATTERNS:
        match = pattern.search(text)
        if match is not None:
            groups = match.groupdict()
            return _tokens(groups.get("limit")), _tokens(groups.get("requested"))
    return None


def context_error(status: int | None, error: Any, message: str) -> ContextTooLong | None:
    """The ContextTooLong to raise when a provider error says the request
    is longer than the model's context window, else None.

    The one place such errors are recognised, for HTTP error responses and
    OpenRouter-style in-stream `error` chunks alike. `status`: the response's
    HTTP status, or the chunk's HTTP-like `code` (None when it has none).
    `error`: the body's `error` object, or the provider's text when there is
    none. `message`: what the exception says (already redacted and cut).

    It is one when the error's `code` or `type` is `context_length_exceeded`
    (whatever the status), or when the status is a permanent 4xx (or an
    in-stream error has no HTTP-like code) and the provider's words match a
    _CONTEXT_PATTERNS entry. The token figures are parsed from the provider's
    full text (OpenRouter's `metadata.raw` included) before any cut."""
    if isinstance(error, dict):
        text = _error_text(error)
        labels = (error.get("code"), error.get("type"))
        by_code = any(isinstance(v, str) and v.lower() == CONTEXT_LENGTH_CODE for v in labels)
    else:
        text, by_code = str(error), False
    permanent = status is None or (400 <= status < 500 and not _retryable(status))
    if not (by_code or permanent):
        return None  # a throttle or an outage, whatever its words: retried as before
    figures = _context_figures(text)
    if figures is None and not by_code:
        return None
    limit, requested = figures or (None, None)
    return ContextTooLong(message, limit_tokens=limit, requested_tokens=requested)


def _error_object(response: httpx.Response) -> Any:
    """The body's `error` value (an object or a string), or None."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("error") if isinstance(body, dict) else None


def _http_error(response: httpx.Response, secrets: Iterable[str]) -> Exception:
    raw = _provider_message(response)
    text = _provider_text(raw, secrets)
    message = f"HTTP {response.status_code} from the model provider: {text}"
    error = _error_object(response)
    too_long = context_error(response.status_code, error if error is not None else raw, message)
    if too_long is not None:
        return too_long
    if _retryable(response.status_code):
        return _Transient(message, retry_after=_retry_after(response))
    # Any other 4xx (a bad request or key, no credits, an unknown model) fails the same way every time.
    return ModelRejected(message)


def _chunk_error(chunk: dict[str, Any], secrets: Iterable[str]) -> Exception | None:
    """OpenRouter reports failures after the 200 as an `error` chunk."""
    error = chunk.get("error")
    if not error:
        return None
    message = _error_text(error) if isinstance(error, dict) else str(error)
    text = f"model provider error mid-stream: {_provider_text(message, secrets)}"
    code = _status_code(error.get("code") if isinstance(error, dict) else None)
    too_long = context_error(code, error, text)
    if too_long is not None:
        return too_long
    if code is not None and _retryable(code):
        return _Transient(text)
    if code is not None and 400 <= code < 500:
        return ModelRejected(text)
    # No HTTP-like code: not retried here, but not called permanent either.
    return ModelUnavailable(text)


# -- the per-thread connection pool ------------------------------------------
#
# The model call goes through httpcore, httpx's own transport, not through an
# httpx.Client: per streamed request the client's layers (URL merging, cookie
# extraction, auth and redirect handling, header models, content decoders)
# cost about as much CPU as the transport itself (0.48 against 0.27 ms per
# request, measured on the fake provider), and a worker makes two such calls
# per two-step turn for a few hundred turns at once. None of those layers has
# work to do here: one POST with a bearer key, no cookies, no redirects
# followed (follow_redirects was already off), no compression asked for. What
# the client did that still matters is kept: the proxy from the environment
# (HTTP(S)_PROXY, NO_PROXY, read once per thread and origin) and a TLS
# context with the CA bundle; an error response is wrapped in an
# httpx.Response so that it is read by the same code as before.

_local = threading.local()
USER_AGENT = b"terret"
# What httpcore raises for a connection that failed or broke (httpx's TransportError, minus timeouts).
_TRANSPORT_ERRORS = (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, httpcore.ProxyError)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context (CA bundle loaded once) for every thread's pool:
    building one per pool costs milliseconds of CPU each."""
    return httpx.create_ssl_context()


def _proxy_for(url: httpcore.URL) -> str | None:
    """The proxy the environment names for this origin, as httpx's
    trust_env reads it (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY)."""
    scheme, host = url.scheme.decode(), url.host.decode()
    if urllib.request.proxy_bypass(host):  # NO_PROXY (the environment, on Linux)
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(scheme) or proxies.get("all")


def shared_pool(url: httpcore.URL) -> httpcore.ConnectionPool:
    """This thread's pool for the origin of `url` (each worker thread runs
    one stream at a time). One process-wide pool would be thread-safe too,
    but httpcore picks a connection by scanning every pooled one, checking
    each idle socket with a syscall: with a few hundred concurrent streams
    that scan was a visible share of a worker's CPU. Recreated after a fork:
    pooled sockets must never be shared between a prefork parent and its
    children."""
    pools: dict[tuple[bytes, bytes, int | None], httpcore.ConnectionPool] | None = getattr(_local, "pools", None)
    if pools is None or getattr(_local, "pid", 0) != os.getpid():
        pools = {}
        _local.pools, _local.sockets, _local.pid = pools, _Sockets(), os.getpid()
    origin = (url.scheme, url.host, url.port)
    pool = pools.get(origin)
    if pool is None:
        limits: dict[str, Any] = {"max_connections": 8, "max_keepalive_connections": 2, "keepalive_expiry": 30.0}
        proxy = _proxy_for(url)
        if proxy is None:
            pool = httpcore.ConnectionPool(ssl_context=tls_context(), **limits)
        else:
            pool = httpcore.HTTPProxy(proxy_url=proxy, ssl_context=tls_context(), **limits)
        pools[origin] = pool
    return pool


def _shutdown(sock: socket.socket) -> None:
    """Make a read blocked on `sock` in another thread return now (EOF or
    an error). close() would not wake it; shutdown() does."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed, or never connected


class _Sockets:
    """The sockets one thread's client has opened, known through httpcore's
    `trace` extension (the only public way to see a connection's stream
    before the response headers arrive)."""

    _EVENTS = ("connect_tcp.complete", "connect_unix_socket.complete", "start_tls.complete")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if not event.endswith(self._EVENTS):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            # A closed socket's fileno is -1 (so is a plain socket that TLS took over).
            self._open = [s for s in self._open if s.fileno() != -1]
            self._open.append(sock)

    def cut(self) -> None:
        with self._lock:
            open_now = list(self._open)
        for sock in open_now:
            _shutdown(sock)


def _response_cut(response: httpcore.Response, sockets: _Sockets) -> Callable[[], None]:
    """The hook that interrupts this response's reads: its own socket."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    return functools.partial(_shutdown, sock) if sock is not None else sockets.cut


# -- the adapter ------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    spec: str
    url: httpcore.URL
    body: dict[str, Any]
    headers: list[tuple[bytes, bytes]]
    known: dict[str, str]  # wire name -> Terret name, for the offered tools
    secrets: tuple[str, ...]  # redacted from every provider message
    content: bytes = b""  # the body as sent: encoded once, for every attempt


@dataclass(frozen=True)
class _Call:
    """One `complete` call: its request and what may stop it."""

    request: _Request
    on_delta: DeltaSink | None
    abort: Abort
    deadline: float  # seconds, for messages
    ends: float  # time.monotonic() when the deadline passes

    def stopped(self, partial: ModelReply | None = None) -> ModelError:
        return deadline.stop_error(self.abort, self.request.spec, partial or ModelReply(content=None), self.deadline)

    def stopping(self) -> bool:
        """True when the call must end now. The clock is read too: the
        watchdog may be a moment behind a timeout that fired at the deadline."""
        if time.monotonic() >= self.ends:
            self.abort.set(DEADLINE)  # the first reason wins: a cancel stays a cancel
        return self.abort.is_set()


class OpenAIAdapter:
    """Chat completions for any OpenAI-compatible endpoint.

    Every argument left as None is read from settings on each call:
    `timeout` (per read, TERRET_LLM_TIMEOUT), `deadline` (per call, wall
    clock, TERRET_LLM_DEADLINE_SECONDS), `retries`, `backoff_base`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff_base: float | None = None,
        deadline: float | None = None,
    ) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.backoff_base = backoff_base
        self.deadline = deadline

    def complete(
        self,
        spec: str,
        messages: list[dict[str, Any]],
        tools: list[ToolSpec],
        on_delta: DeltaSink | None = None,
        abort: Abort | None = None,
    ) -> ModelReply:
        """The model's reply. Raises ModelRejected (a 4xx other than 408/429,
        at once; ContextTooLong when the request outgrew the model's context
        window, see context_error), ModelUnavailable (retries exhausted), TornStream (the stream
        broke after text was shown), ModelDeadline (the deadline passed) or
        ModelCancelled (`abort` was set; its `partial` holds what streamed)."""
        request = self._build(spec, messages, tools)
        seconds = self.deadline if self.deadline is not None else float(settings.TERRET_LLM_DEADLINE_SECONDS)
        # Without the caller's Abort the deadline still needs one to set.
        abort = abort if abort is not None else Abort()
        call = _Call(request, on_delta, abort, seconds, time.monotonic() + seconds)
        disarm = deadline.arm(call.abort, seconds)
        try:
            return self._run(call)
        finally:
            disarm()

    def _run(self, call: _Call) -> ModelReply:
        retries = self.retries if self.retries is not None else settings.TERRET_LLM_RETRIES
        attempt = 0
        while True:
            if call.stopping():
                raise call.stopped()
            state = _StreamState(call.on_delta)
            try:
                return self._attempt(call, state)
            except Exception as err:
                if call.stopping():
                    # Whatever the cut read raised, the call ends for the abort's reason, never retried.
                    raise call.stopped(state.partial()) from err
                if not isinstance(err, _Transient):
                    raise
                self._pause(call, attempt, retries, state, err)
            attempt += 1

    def _pause(self, call: _Call, attempt: int, retries: int, state: _StreamState, err: _Transient) -> None:
        """Wait before the next attempt, or raise if there is none."""
        spec = call.request.spec
        if state.emitted:
            torn = TornStream(f"{spec}: the stream ended before [DONE] after output was shown ({err})")
            torn.usage = state.usage
            raise torn from err
        if attempt >= retries:
            raise ModelUnavailable(f"{spec}: gave up after {attempt + 1} attempt(s): {err}") from err
        delay = self._delay(attempt, err.retry_after, spec)
        logger.warning("model %s attempt %d failed (%s); retrying in %.2fs", spec, attempt + 1, err, delay)
        if call.abort.wait(delay):  # a cancel or the deadline ends the sleep at once
            raise call.stopped() from err

    def _build(self, spec: str, messages: list[dict[str, Any]], tools: list[ToolSpec]) -> _Request:
        base = (self.base_url or settings.TERRET_LLM_BASE_URL or "").rstrip("/")
        if not base:
            raise ModelNotConfigured(f"{spec}: TERRET_LLM_BASE_URL is empty")
        key = self.api_key if self.api_key is not None else settings.TERRET_LLM_API_KEY
        headers = [
            (b"Accept", b"text/event-stream"),
            (b"Content-Type", b"application/json"),
            (b"User-Agent", USER_AGENT),
        ]
        if key:
            headers.append((b"Authorization", f"Bearer {key}".encode()))
        body: dict[str, Any] = {
            "model": spec,
            "messages": _wire_messages(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "usage": {"include": True},  # OpenRouter: adds `cost` to the usage chunk
        }
        if tools:
            body["tools"] = [_wire_tool(t) for t in tools]
        known = {to_wire(t.name): t.name for t in tools}
        try:
            url = _endpoint(base)
        except ValueError as err:
            raise ModelNotConfigured(f"{spec}: TERRET_LLM_BASE_URL {err}") from err
        # As httpx encodes a json= body: compact, UTF-8, no NaN.
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        return _Request(spec, url, body, headers, known, secrets=(key,) if key else (), content=content)

    def _timeout(self, ends: float) -> dict[str, float]:
        seconds = self.timeout if self.timeout is not None else settings.TERRET_LLM_TIMEOUT
        # connect() has no socket to cut yet, so it alone must end by the deadline on its own.
        connect = min(seconds, CONNECT_TIMEOUT_SECONDS, max(0.05, ends - time.monotonic()))
        return {"connect": connect, "read": seconds, "write": seconds, "pool": seconds}

    def _attempt(self, call: _Call, state: _StreamState) -> ModelReply:
        request = call.request
        pool = shared_pool(request.url)
        sockets: _Sockets = _local.sockets  # created with the thread's pools
        # Before the headers, which pooled connection carries the request is not
        # known: an abort cuts all of this thread's (the others are idle ones).
        unbind = call.abort.bind(sockets.cut)
        try:
            with pool.stream(
                b"POST",
                request.url,
                headers=request.headers,
                content=request.content,
                extensions={"timeout": self._timeout(call.ends), "trace": sockets.trace},
            ) as response:
                unbind()
                unbind = call.abort.bind(_response_cut(response, sockets))
                try:
                    return self._respond(response, request, state)
                finally:
                    unbind()  # before the response closes (and frees) its socket
        except httpcore.TimeoutException as err:
            raise _Transient(f"timed out before the response began ({type(err).__name__})") from err
        except _TRANSPORT_ERRORS as err:
            raise _Transient(f"connection failed ({type(err).__name__}: {err})") from err
        finally:
            unbind()

    def _respond(self, response: httpcore.Response, request: _Request, state: _StreamState) -> ModelReply:
        if response.status >= 400:
            body = b"".join(response.iter_stream())
            raise _http_error(httpx.Response(response.status, headers=response.headers, content=body), request.secrets)
        return self._consume(response, request, state)

    def _consume(self, response: httpcore.Response, request: _Request, state: _StreamState) -> ModelReply:
        try:
            lines = iter_lines(response.iter_stream())
            for data in iter_sse_data(lines):
                if data.strip() == "[DONE]":
                    reply = state.reply(request.known)
                    _drain(lines)
                    return reply
                self._feed_event(data, request, state)
        except httpcore.TimeoutException as err:
            raise _Transient(f"stream torn: no data within the read timeout ({type(err).__name__})") from err
        except _TRANSPORT_ERRORS as err:
            raise _Transient(f"stream torn: {type(err).__name__}: {err}") from err
        raise _Transient("stream torn: the connection closed before [DONE]")

    def _feed_event(self, data: str, request: _Request, state: _StreamState) -> None:
        try:
            chunk = json.loads(data)
        except ValueError as err:
            raise _Transient(f"stream torn: unparseable chunk {redact(data, request.secrets)[:80]!r}") from err
        if not isinstance(chunk, dict):
            raise _Transient(f"stream torn: a chunk that is not an object {redact(data, request.secrets)[:80]!r}")
        failure = _chunk_error(chunk, request.secrets)
        if failure is not None:
            raise failure
        state.feed(chunk)

    def _delay(self, attempt: int, retry_after: float | None, spec: str) -> float:
        if retry_after is not None:
            if retry_after > MAX_RETRY_AFTER_SECONDS:
                raise ModelUnavailable(f"{spec}: provider asked to retry after {retry_after:.0f}s; not waiting")
            return retry_after
        base = self.backoff_base
        if base is None:
            base = float(getattr(settings, "TERRET_LLM_BACKOFF_BASE", BACKOFF_BASE_SECONDS))
        # Full jitter keeps a burst of 200 throttled streams from retrying in lockstep.
        return random.uniform(0.5, 1.0) * min(BACKOFF_MAX_SECONDS, base * 2**attempt)


@functools.lru_cache(maxsize=64)
def _endpoint(base: str) -> httpcore.URL:
    """The chat completions URL of a base URL, parsed once (parsing it per
    call was a visible share of building a request). ValueError when it is
    not an http(s) URL."""
    try:
        url = httpcore.URL(f"{base}/chat/completions")
    except (TypeError, ValueError) as err:
        raise ValueError(f"is not a URL ({err})") from err
    if url.scheme not in (b"http", b"https") or not url.host:
        raise ValueError(f"must be an http(s) URL, not {base!r}")
    return url


def _drain(lines: Iterator[str]) -> None:
    """Read what follows [DONE] (the end of the chunked body), so the
    connection goes back to the pool instead of being closed: a new TCP
    connection per model call costs more CPU than the call's own parsing."""
    try:
        for _ in lines:
            pass
    except (httpcore.TimeoutException, *_TRANSPORT_ERRORS, OSError, ValueError):
        pass  # the reply is complete; a connection that cannot be reused (or was cut) is just closed
