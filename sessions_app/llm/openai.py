"""OpenAI-compatible chat completions over SSE (OpenRouter by default).

Runs in Celery worker threads, up to a few hundred concurrent streams per
process; each thread keeps its own lazily created httpx.Client (see
shared_client).
Settings are read at call time, so overrides (tests, `settings` fixture) apply
to the process-wide adapter singleton too.
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
import ssl
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings

from sessions_app.llm.types import (
    DeltaSink,
    ModelNotConfigured,
    ModelReply,
    ModelUnavailable,
    ToolCall,
    ToolSpec,
    TornStream,
    Usage,
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


class _Transient(Exception):
    """A failure worth another attempt, unless output was already shown."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _provider_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500].strip() or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return json.dumps(body)[:500]


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


def _http_error(response: httpx.Response) -> Exception:
    message = f"HTTP {response.status_code} from the model provider: {_provider_message(response)}"
    if response.status_code in (408, 429) or response.status_code >= 500:
        return _Transient(message, retry_after=_retry_after(response))
    return ModelUnavailable(message)


def _chunk_error(chunk: dict[str, Any]) -> Exception | None:
    """OpenRouter reports failures after the 200 as an `error` chunk."""
    error = chunk.get("error")
    if not error:
        return None
    message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
    code = error.get("code") if isinstance(error, dict) else None
    text = f"model provider error mid-stream: {message}"
    if isinstance(code, int) and (code in (408, 429) or code >= 500):
        return _Transient(text)
    return ModelUnavailable(text)


# -- the per-thread client --------------------------------------------------

_local = threading.local()


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context (CA bundle loaded once) for every thread's client:
    building one per client costs milliseconds of CPU each."""
    return httpx.create_ssl_context()


def shared_client() -> httpx.Client:
    """This thread's client (each worker thread runs one stream at a time).
    One process-wide pool would be thread-safe too, but httpcore picks a
    connection by scanning every pooled one, checking each idle socket with
    a syscall: with a few hundred concurrent streams that scan was a visible
    share of a worker's CPU. Recreated after a fork: pooled sockets must never
    be shared between a prefork parent and its children."""
    client: httpx.Client | None = getattr(_local, "client", None)
    if client is None or getattr(_local, "pid", 0) != os.getpid():
        limits = httpx.Limits(max_connections=8, max_keepalive_connections=2, keepalive_expiry=30.0)
        client = httpx.Client(limits=limits, follow_redirects=False, verify=tls_context())
        _local.client, _local.pid = client, os.getpid()
    return client


# -- the adapter ------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    known: dict[str, str]  # wire name -> Terret name, for the offered tools


class OpenAIAdapter:
    """Chat completions for any OpenAI-compatible endpoint.

    Every argument left as None is read from settings on each call."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff_base: float | None = None,
    ) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.backoff_base = backoff_base

    def complete(
        self,
        spec: str,
        messages: list[dict[str, Any]],
        tools: list[ToolSpec],
        on_delta: DeltaSink | None = None,
    ) -> ModelReply:
        request = self._build(spec, messages, tools)
        retries = self.retries if self.retries is not None else settings.TERRET_LLM_RETRIES
        attempt = 0
        while True:
            state = _StreamState(on_delta)
            try:
                return self._attempt(request, state)
            except _Transient as err:
                if state.emitted:
                    raise TornStream(f"{spec}: the stream ended before [DONE] after output was shown ({err})") from err
                if attempt >= retries:
                    raise ModelUnavailable(f"{spec}: gave up after {attempt + 1} attempt(s): {err}") from err
                delay = self._delay(attempt, err.retry_after, spec)
                logger.warning("model %s attempt %d failed (%s); retrying in %.2fs", spec, attempt + 1, err, delay)
                time.sleep(delay)
                attempt += 1

    def _build(self, spec: str, messages: list[dict[str, Any]], tools: list[ToolSpec]) -> _Request:
        base = (self.base_url or settings.TERRET_LLM_BASE_URL or "").rstrip("/")
        if not base:
            raise ModelNotConfigured(f"{spec}: TERRET_LLM_BASE_URL is empty")
        key = self.api_key if self.api_key is not None else settings.TERRET_LLM_API_KEY
        headers = {"Accept": "text/event-stream"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body: dict[str, Any] = {
            "model": spec,
            "messages": [_wire_message(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "usage": {"include": True},  # OpenRouter: adds `cost` to the usage chunk
        }
        if tools:
            body["tools"] = [_wire_tool(t) for t in tools]
        known = {to_wire(t.name): t.name for t in tools}
        return _Request(url=f"{base}/chat/completions", body=body, headers=headers, known=known)

    def _timeout(self) -> httpx.Timeout:
        seconds = self.timeout if self.timeout is not None else settings.TERRET_LLM_TIMEOUT
        return httpx.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT_SECONDS))

    def _attempt(self, request: _Request, state: _StreamState) -> ModelReply:
        client = shared_client()
        try:
            with client.stream(
                "POST", request.url, json=request.body, headers=request.headers, timeout=self._timeout()
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _http_error(response)
                return self._consume(response, request, state)
        except httpx.TimeoutException as err:
            raise _Transient(f"timed out before the response began ({type(err).__name__})") from err
        except httpx.TransportError as err:
            raise _Transient(f"connection failed ({type(err).__name__}: {err})") from err

    def _consume(self, response: httpx.Response, request: _Request, state: _StreamState) -> ModelReply:
        try:
            lines = iter_lines(response.iter_bytes())
            for data in iter_sse_data(lines):
                if data.strip() == "[DONE]":
                    reply = state.reply(request.known)
                    _drain(lines)
                    return reply
                self._feed_event(data, state)
        except httpx.TimeoutException as err:
            raise _Transient(f"stream torn: no data within the read timeout ({type(err).__name__})") from err
        except httpx.TransportError as err:
            raise _Transient(f"stream torn: {type(err).__name__}: {err}") from err
        raise _Transient("stream torn: the connection closed before [DONE]")

    def _feed_event(self, data: str, state: _StreamState) -> None:
        try:
            chunk = json.loads(data)
        except ValueError as err:
            raise _Transient(f"stream torn: unparseable chunk {data[:80]!r}") from err
        failure = _chunk_error(chunk)
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


def _drain(lines: Iterator[str]) -> None:
    """Read what follows [DONE] (the end of the chunked body), so the
    connection goes back to the pool instead of being closed: a new TCP
    connection per model call costs more CPU than the call's own parsing."""
    try:
        for _ in lines:
            pass
    except httpx.HTTPError:
        pass  # the reply is complete; a connection that cannot be reused is just closed
