"""OpenTelemetry traces of turns (runtime/tracing.py), GenAI conventions.

- In process, with the SDK's InMemorySpanExporter: a turn's spans, their
  names, attributes and parents; the turn/start traceparent names the root.
- Off by default: a process without OTEL_EXPORTER_OTLP_ENDPOINT imports no
  OpenTelemetry SDK module, and turn/start carries no traceparent.
- Across a kill -9: real Celery workers export through the real OTLP/HTTP
  exporter to a collector in this test (the OTLP protobuf decoded with the
  SDK's own opentelemetry-proto); the turn the second worker re-enters is one
  trace with the first worker's spans.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sessions_app import services
from sessions_app.models import Session
from sessions_app.runtime import tracing
from sessions_app.runtime.drive import drive
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for
from tests.workers import ROOT


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.use_exporter(exporter)
    yield exporter
    tracing.use_exporter(None)


def ids_of(traceparent: str) -> tuple[int, int]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
def test_a_turn_is_one_trace_of_agent_chat_and_tool_spans(
    spans: InMemorySpanExporter, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(
        Reply(tool_calls=[("debug.sleep", {"seconds": 0}), ("debug.noop", {})], usage=(12, 3, None)),
        Reply(text="done", usage=(20, 4, None)),
    )
    services.run_turn(session.id, "go")
    assert drive(session.id) == "ended"

    (start,) = events(session, "turn/start")
    trace_id, root_id = ids_of(start["traceparent"])
    finished = spans.get_finished_spans()
    assert sorted(s.name for s in finished) == [
        "chat test/model",
        "chat test/model",
        "execute_tool debug.noop",
        "execute_tool debug.sleep",
        f"invoke_agent {session.profile.name}",
    ]
    assert {s.context.trace_id for s in finished} == {trace_id}
    (agent,) = [s for s in finished if s.name.startswith("invoke_agent")]
    assert agent.context.span_id == root_id and agent.parent is None  # the root named in turn/start
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["terret.turn.outcome"] == "ended" and agent.attributes["terret.turn.continued"] is False
    for span in finished:
        assert span.attributes["gen_ai.conversation.id"] == str(session.id)
        if span is not agent:
            assert span.parent is not None and span.parent.span_id == root_id
    chats = sorted((s for s in finished if s.name.startswith("chat")), key=lambda s: s.start_time or 0)
    usage = [(s.attributes["gen_ai.usage.input_tokens"], s.attributes["gen_ai.usage.output_tokens"]) for s in chats]
    assert usage == [(12, 3), (20, 4)]
    assert {s.attributes["gen_ai.request.model"] for s in chats} == {"test/model"}
    calls = {c["name"]: c["id"] for c in events(session, "assistant/message")[0]["tool_calls"]}
    for span in finished:
        if span.name.startswith("execute_tool"):
            name = span.attributes["gen_ai.tool.name"]
            assert span.attributes["gen_ai.tool.call.id"] == calls[name]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
def test_off_by_default_writes_no_traceparent(fake_llm: Any, session: Session) -> None:
    assert not tracing.enabled()
    fake_llm.script(Reply(text="hi"))
    services.run_turn(session.id, "go")
    drive(session.id)
    assert [{k: v for k, v in e.items() if k != "version"} for e in events(session, "turn/start")] == [{}]


def test_off_by_default_no_tracing_sdk_is_imported() -> None:
    """A process without the OTLP endpoint runs a turn's code paths with no
    tracing SDK or exporter module loaded, and every call is the shared
    no-op. (redis-py imports the metrics SDK at start when it is installed;
    that is its own optional feature, loaded once, not tracing.)"""
    code = (
        "import os, sys, django; os.environ['DJANGO_SETTINGS_MODULE'] = 'terret_site.settings'; django.setup();"
        "import sessions_app.runtime.runner, sessions_app.runtime.drive, sessions_app.tasks;"
        "from sessions_app.runtime import tracing;"
        "noop = tracing.turn(None, 'a', 1, []) is tracing.chat(None, 'm', 1) is tracing.tool(None, 't', 'c');"
        "loaded = [m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter'))];"
        "print(tracing.enabled(), noop, loaded)"
    )
    env = {"PATH": "/usr/bin:/bin", "TERRET_TESTING": "1", "SECRET_KEY": "x"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False True []", out.stderr


# -- across a kill -9 --------------------------------------------------------------


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every span exported to it, decoded."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CollectorHandler)
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def named(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"].startswith(prefix)]


class _CollectorHandler(BaseHTTPRequestHandler):
    server: Collector

    def log_message(self, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    with self.server.lock:
                        self.server.spans.append(
                            {
                                "name": span.name,
                                "trace_id": int.from_bytes(span.trace_id),
                                "span_id": int.from_bytes(span.span_id),
                                "parent_id": int.from_bytes(span.parent_span_id) if span.parent_span_id else None,
                                "attributes": attributes,
                                "instance": resource.get("service.instance.id"),
                            }
                        )
        body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_turn_re_entered_after_kill_9_is_one_trace(
    spans: InMemorySpanExporter, collector: Collector, start_worker: Any, fake_llm: Any, session: Session
) -> None:
    """`spans` turns tracing on in this process, which opens the turn and so writes its traceparent."""
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    fake_llm.script(Reply(tool_calls=[("debug.sleep", {"seconds": 3})]), Reply(text="rested"))
    first = start_worker(name="a", **otel)
    services.inject(session.id, "sleep a little", wake=True)  # this process opens the turn: tracing is on here
    wait_for(lambda: events(session, "tool/attempt"), what="the intent")
    wait_for(lambda: collector.named("chat"), timeout=10, what="the first worker's chat span")
    first.kill()
    assert not events(session, "tool/result")

    start_worker(name="b", **otel)
    wait_for(lambda: events(session, "turn/end"), timeout=40, what="turn/end after recovery")
    wait_for(lambda: collector.named("invoke_agent"), timeout=10, what="the second worker's invoke_agent span")

    (start,) = events(session, "turn/start")
    trace_id, root_id = ids_of(start["traceparent"])
    everything = collector.named("")
    assert {s["trace_id"] for s in everything} == {trace_id}, "one trace for the whole turn"
    (first_chat, second_chat) = sorted(collector.named("chat"), key=lambda s: s["attributes"]["terret.step"])
    (agent,) = collector.named("invoke_agent")  # the first worker's never ended: it was killed
    assert first_chat["parent_id"] == root_id  # under the root that turn/start names
    assert agent["parent_id"] == root_id and agent["attributes"]["terret.turn.continued"] is True
    assert first_chat["instance"] != agent["instance"]  # two processes, one trace
    (tool,) = collector.named("execute_tool")  # the re-run of the safe call, by the second worker
    assert tool["parent_id"] == agent["span_id"] == second_chat["parent_id"]
    assert tool["attributes"]["gen_ai.tool.call.id"] == events(session, "tool/attempt")[1]["call_id"]
    assert all(s["attributes"]["gen_ai.conversation.id"] == str(session.id) for s in everything)
    assert events(session, "turn/end")[0]["status"] == "completed"
