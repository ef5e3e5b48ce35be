"""OpenTelemetry traces of turns, after the GenAI semantic conventions.

One trace per turn, however many drives it takes (an approval's park, a
worker killed mid-step): `invoke_agent {profile}` for each drive of the turn,
`chat {model}` for each model call (gen_ai.usage.input_tokens and
output_tokens), `execute_tool {name}` for each tool call (gen_ai.tool.call.id);
every span has gen_ai.conversation.id = the session id.

The turn's trace context is in the log: turn/start carries a W3C
`traceparent` naming the turn's own root span. The drive that starts the
turn's first step opens that very span (same trace id, same span id: a
custom id generator); a later drive of the same turn, on any worker, opens
a child of it. A turn/start written while tracing was off (or by a process
without it) has none; its ids are then derived from the session id and the
turn's seq, so its drives still share one trace.

Off by default, and then free: tracing is on only when
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set
and OTEL_SDK_DISABLED is not true. Off, no OpenTelemetry module is imported
and each call below returns a shared no-op at the cost of one attribute
read. On, spans go to the OTLP/HTTP exporter through a batch processor
(the exporter reads the standard OTEL_* variables itself). Tests install an
exporter of their own with `use_exporter`.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import threading
import uuid
from collections.abc import Iterable
from contextvars import ContextVar
from types import TracebackType
from typing import Any

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def _wanted() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


class _State:
    """What the process traces with; `tracer` None means off."""

    def __init__(self) -> None:
        self.wanted = _wanted()
        self.tracer: Any = None
        self.provider: Any = None
        self.lock = threading.Lock()


_state = _State()
# The (trace id, span id) the next span must take: set only around the start
# of a turn's first drive, read by the id generator (same thread, same context).
_forced_ids: ContextVar[tuple[int, int] | None] = ContextVar("terret_forced_ids", default=None)


def enabled() -> bool:
    return _state.wanted


def _tracer() -> Any:
    if _state.tracer is None:
        with _state.lock:
            if _state.tracer is None:
                _install(_otlp_exporter(), batch=True)
    return _state.tracer


def _otlp_exporter() -> Any:
    # Imported here: the SDK and the exporter load only when tracing is on.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _install(exporter: Any, *, batch: bool) -> None:
    # Imported here: the SDK loads only when tracing is on.
    import atexit

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class TurnIds(RandomIdGenerator):
        """Random ids, except for the span that is a turn's root: the ids
        written in its turn/start."""

        def generate_span_id(self) -> int:
            forced = _forced_ids.get()
            return forced[1] if forced else super().generate_span_id()

        def generate_trace_id(self) -> int:
            forced = _forced_ids.get()
            return forced[0] if forced else super().generate_trace_id()

    # The instance says which process a span came from (a turn's drives may be on several).
    instance = f"{socket.gethostname()}:{os.getpid()}"
    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "terret", "service.instance.id": instance}
    )
    provider = TracerProvider(resource=resource, id_generator=TurnIds())
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    if _state.provider is not None:
        _state.provider.shutdown()
    else:
        atexit.register(lambda: _state.provider is not None and _state.provider.shutdown())
    _state.provider = provider
    _state.tracer = provider.get_tracer("terret", schema_url="https://opentelemetry.io/schemas/1.37.0")


def use_exporter(exporter: Any | None) -> None:
    """Trace into `exporter` (each span exported as it ends), or, with None,
    turn tracing off again: for tests."""
    with _state.lock:
        if exporter is None:
            if _state.provider is not None:
                _state.provider.shutdown()
            _state.provider = _state.tracer = None
            _state.wanted = False
            return
        _install(exporter, batch=False)
        _state.wanted = True


# -- the trace context in the log ---------------------------------------------


def turn_start(data: dict[str, Any]) -> dict[str, Any]:
    """turn/start's payload, with a fresh `traceparent` when tracing is on."""
    if not _state.wanted:
        return data
    return {**data, "traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}


def _turn_ids(session_id: uuid.UUID, turn_seq: int, events: Iterable[Any]) -> tuple[int, int]:
    for event in events:
        if event.seq == turn_seq and event.kind == "turn/start":
            found = _TRACEPARENT.match(str(event.data.get("traceparent") or ""))
            if found and int(found.group(1), 16) and int(found.group(2), 16):
                return int(found.group(1), 16), int(found.group(2), 16)
            break
    digest = hashlib.sha256(f"terret-turn:{session_id}:{turn_seq}".encode()).digest()
    return int.from_bytes(digest[:16]) or 1, int.from_bytes(digest[16:24]) or 1


# -- spans ----------------------------------------------------------------------


class _NoSpan:
    """What every call returns while tracing is off."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def outcome(self, value: Any) -> Any:
        return value

    def replied(self, reply: Any) -> Any:
        return reply

    def result(self, is_error: bool) -> None:
        return None


_NO_SPAN = _NoSpan()


class _Span:
    """A live span, current while its block runs."""

    def __init__(self, name: str, attributes: dict[str, Any], context: Any = None, kind: str = "INTERNAL") -> None:
        self._name, self._attributes, self._context, self._kind = name, attributes, context, kind
        self._cm: Any = None
        self.span: Any = None

    def __enter__(self) -> _Span:
        from opentelemetry.trace import SpanKind  # here: loaded only while tracing is on

        self._cm = _tracer().start_as_current_span(
            self._name, context=self._context, kind=SpanKind[self._kind], attributes=self._attributes
        )
        self.span = self._cm.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.span.set_attribute("error.type", exc_type.__name__)
        self._cm.__exit__(exc_type, exc, tb)

    def outcome(self, value: Any) -> Any:
        """Note how the drive of the turn ended (runtime Outcome) and pass it on."""
        self.span.set_attribute("terret.turn.outcome", str(getattr(value, "value", value)))
        return value

    def replied(self, reply: Any) -> Any:
        """Note a model reply's usage and finish reason and pass it on."""
        usage = getattr(reply, "usage", None)
        if usage is not None:
            self.span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            self.span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        if getattr(reply, "finish_reason", None):
            self.span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
        return reply

    def result(self, is_error: bool) -> None:
        if is_error:
            from opentelemetry.trace import Status, StatusCode  # here: loaded only while tracing is on

            self.span.set_attribute("error.type", "tool_error")
            self.span.set_status(Status(StatusCode.ERROR, "the tool returned an error"))


class _TurnSpan(_Span):
    """`invoke_agent`: the turn's root span in its first drive (the ids in
    turn/start), a child of it in every later drive."""

    def __init__(self, attributes: dict[str, Any], ids: tuple[int, int], first: bool, name: str) -> None:
        super().__init__(name, attributes)
        self._ids, self._first = ids, first

    def __enter__(self) -> _Span:
        from opentelemetry import context, trace  # here: loaded only while tracing is on

        if self._first:
            self._context = context.Context()  # a root: the ids come from _forced_ids
            token = _forced_ids.set(self._ids)
            try:
                return super().__enter__()
            finally:
                _forced_ids.reset(token)
        parent = trace.SpanContext(
            self._ids[0], self._ids[1], is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
        )
        self._context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        return super().__enter__()


def turn(session_id: uuid.UUID, agent: str, turn_seq: int, events: list[Any]) -> _NoSpan | _Span:
    """The span of one drive of a turn; `events` are the turn's, as loaded."""
    if not _state.wanted:
        return _NO_SPAN
    first = not any(e.kind == "step/start" for e in events)
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": str(session_id),
        "terret.turn.seq": turn_seq,
        "terret.turn.continued": not first,
    }
    return _TurnSpan(attributes, _turn_ids(session_id, turn_seq, events), first, f"invoke_agent {agent}")


def chat(session_id: uuid.UUID, model: str, step: int) -> _NoSpan | _Span:
    """The span of one model call of step `step`."""
    if not _state.wanted:
        return _NO_SPAN
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.provider.name": model.split("/", 1)[0] if "/" in model else "openai",
        "gen_ai.conversation.id": str(session_id),
        "terret.step": step,
    }
    return _Span(f"chat {model}", attributes, kind="CLIENT")


def tool(session_id: uuid.UUID, name: str, call_id: str) -> _NoSpan | _Span:
    """The span of one tool call's run."""
    if not _state.wanted:
        return _NO_SPAN
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "extension" if name.startswith("mcp.") else "function",
        "gen_ai.conversation.id": str(session_id),
    }
    return _Span(f"execute_tool {name}", attributes)
