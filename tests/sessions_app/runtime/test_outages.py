"""Faults outside Terret, from outside (docs/runtime.md, "Faults outside Terret").

A private stack (tests/stack.py: our own PostgreSQL cluster and redis-server,
daphne, two Celery workers with the default lease and sweep settings, the
fake model server in this process) is driven through the HTTP API only,
while its PostgreSQL is restarted mid-turn and its Redis is stopped for 20 s:

- a PostgreSQL restart stalls a turn by about the restart's length: the turn
  completes a few seconds after the database accepts connections again, with
  one turn/end and a gapless log, and at most the interrupted step redone;
- input posted while Redis is down is answered 202 at once and is in the log;
  its turn runs, once, a few seconds after Redis is back; a session socket
  open across the outage delivers that turn's events.

The machine's shared PostgreSQL and Redis are never touched. Marked `worker`
so it runs in the PostgreSQL pass; skipped where the PostgreSQL server
binaries or redis-server are missing (a failure with TERRET_NO_SKIP=1).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests import stack as stack_module
from tests.fakes.fake_llm import FakeLLM, Reply
from tests.stack import Outage, Stack

pytestmark = [pytest.mark.worker]

PROFILE = "outage"
# How soon after a service returns its turns must have ended.
RESUME_WITHIN = 8.0
REDIS_OUTAGE = 20.0
REPORT: list[str] = []


def report(line: str) -> None:
    """A measured figure: printed at the end of the module (run with -s to see them)."""
    REPORT.append(line)


Plan = Callable[[int, dict[str, Any]], Reply]


class Model:
    """The fake model's responder: a plan per input (the turn's last user
    message), called with how many requests that input had before; and the
    time of every request, per input."""

    def __init__(self) -> None:
        self.plans: dict[str, Plan] = {}
        self.seen: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        users = [m.get("content") for m in body.get("messages") or [] if m.get("role") == "user"]
        text = str(users[-1]) if users else ""
        with self._lock:
            times = self.seen.setdefault(text, [])
            n = len(times)
            times.append(time.time())
        plan = self.plans.get(text)
        return plan(n, body) if plan is not None else Reply(text="ok")

    def requests(self, text: str) -> list[float]:
        with self._lock:
            return list(self.seen.get(text, []))


@pytest.fixture(scope="module")
def model() -> Model:
    return Model()


@pytest.fixture(scope="module")
def fake(model: Model) -> Iterator[FakeLLM]:
    with FakeLLM(model) as llm:
        yield llm


@pytest.fixture(scope="module")
def stack(fake: FakeLLM) -> Iterator[Stack]:
    reason = stack_module.missing()
    if reason is not None:
        if os.environ.get("TERRET_NO_SKIP") == "1":
            pytest.fail(f"TERRET_NO_SKIP=1 but the private stack cannot run: {reason}")
        pytest.skip(f"private stack: {reason}")
    profiles = {
        PROFILE: {
            "roles": {"main": "test/model"},
            "builtin_tools": ["debug.sleep", "debug.noop"],
            "allow_floor": ["*"],
        }
    }
    with Stack(llm_base_url=fake.base_url, workers=2, profiles=profiles) as s:
        report(f"stack up in {s.timings['start']:.1f}s ({', '.join(f'{k} {v:.1f}s' for k, v in s.timings.items())})")
        yield s
        print("", *(f"[outages] {line}" for line in REPORT), sep="\n")


# -- the API, as a client uses it ------------------------------------------------------


def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


@dataclass
class Api:
    client: httpx.Client
    statuses: list[int] = field(default_factory=list)  # of every tolerant GET
    seen_at: float = 0.0  # when wait_events last saw its condition (time.time())

    def new_session(self) -> str:
        r = self.client.post("/api/sessions", json={"profile": PROFILE})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def post_input(self, sid: str, text: str) -> tuple[httpx.Response, float]:
        t0 = time.monotonic()
        r = self.client.post(f"/api/sessions/{sid}/inputs", json={"text": text})
        return r, time.monotonic() - t0

    def events(self, sid: str) -> list[dict[str, Any]] | None:
        """Every event, or None while the server cannot answer (a 5xx, no connection)."""
        out: list[dict[str, Any]] = []
        while True:
            try:
                r = self.client.get(f"/api/sessions/{sid}/events", params={"after": len(out), "limit": 1000})
            except httpx.HTTPError:
                self.statuses.append(0)
                return None
            self.statuses.append(r.status_code)
            if r.status_code != 200:
                return None
            body = r.json()
            out += body["events"]
            if not body["events"] or out[-1]["seq"] >= body["last_seq"]:
                return out

    def wait_events(self, sid: str, until: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] | None = None
        while time.monotonic() < deadline:
            evs = self.events(sid)
            if evs is not None:
                last = evs
                if until(evs):
                    self.seen_at = time.time()
                    return evs
            time.sleep(0.1)
        kinds = [e["kind"] for e in last or []]
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; log: {kinds}")


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    with stack.client() as client:
        yield Api(client)


def ended(evs: list[dict[str, Any]], count: int = 1) -> bool:
    return sum(e["kind"] == "turn/end" for e in evs) >= count


def assert_one_clean_turn(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """Gapless seqs, exactly one turn/start and one turn/end, completed; the turn/end."""
    seqs = [e["seq"] for e in evs]
    assert seqs == list(range(1, len(evs) + 1)), f"seqs must be gapless: {seqs}"
    kinds = [e["kind"] for e in evs]
    assert kinds.count("turn/start") == 1, kinds
    assert kinds.count("turn/end") == 1, kinds
    end = next(e for e in evs if e["kind"] == "turn/end")
    assert end["data"]["status"] == "completed", end
    return end


def rel(times: list[float], origin: float) -> list[float]:
    return [round(t - origin, 2) for t in times]


def timeline(evs: list[dict[str, Any]], origin: float) -> str:
    return ", ".join(f"{e['seq']}:{e['kind']}@{at(e) - origin:+.2f}" for e in evs)


# -- PostgreSQL restarted mid-turn -----------------------------------------------------


def streamed_once(n: int, body: dict[str, Any]) -> Reply:
    """About 3 s of streamed text the first time; at once when redone."""
    if n == 0:
        return Reply(text=" ".join(f"w{i}" for i in range(15)), chunk_delay=0.2)
    return Reply(text="redone")


def tool_then_final(n: int, body: dict[str, Any]) -> Reply:
    """A 2 s tool call, then (after its result) the final answer."""
    if body["messages"][-1].get("role") == "tool":
        return Reply(text="done")
    return Reply(tool_calls=[("debug.sleep", {"seconds": 2})])


@dataclass
class PgCase:
    name: str
    plan: Plan
    steps: int  # model steps the turn takes when nothing fails
    gap: float  # seconds PostgreSQL stays down
    trigger: str  # what the test waits for before stopping PostgreSQL
    delay: float  # then this long


PG_CASES = [
    # The step's model reply (about 3 s) finishes while the database is down:
    # its commit is refused, the drive backs off until the database answers.
    PgCase("down-across-the-commit", streamed_once, steps=1, gap=3.0, trigger="model-request", delay=1.0),
    # A fast restart (stop, start at once) while a tool runs: the database is
    # back before the tool's result is committed, on a pool of dead connections.
    PgCase("fast-restart-between-steps", tool_then_final, steps=2, gap=0.0, trigger="tool-call", delay=0.3),
]


@pytest.mark.parametrize("case", PG_CASES, ids=[c.name for c in PG_CASES])
def test_postgres_restart_mid_turn_resumes_within_seconds(stack: Stack, api: Api, model: Model, case: PgCase) -> None:
    sid = api.new_session()
    text = f"pg restart {case.name} {time.monotonic_ns()}"
    model.plans[text] = case.plan
    r, _ = api.post_input(sid, text)
    assert r.status_code == 202, r.text

    if case.trigger == "model-request":
        wait(lambda: model.requests(text), 15, "the model request")
    else:
        api.wait_events(sid, lambda evs: any(e["kind"] == "assistant/message" for e in evs), 15, "the tool call")
    time.sleep(case.delay)
    outage: Outage = stack.postgres.restart(gap=case.gap)
    n_status = len(api.statuses)

    evs = api.wait_events(sid, ended, 40, "turn/end after the restart")
    # Committed by then (polled every 0.1 s); an event's `at` is when it was
    # made, which for a buffered append is before its commit.
    stall = api.seen_at - outage.up_at
    assert_one_clean_turn(evs)
    requests = model.requests(text)
    errors = [s for s in api.statuses[n_status:] if s != 200]
    results = [e for e in evs if e["kind"] == "tool/result"]
    report(
        f"pg {case.name}: down {outage.length:.2f}s; turn/end {stall:.2f}s after PostgreSQL accepted again; "
        f"model requests {len(requests)} (steps {case.steps}) at {rel(requests, outage.up_at)}; "
        f"tool results {len(results)}; API GETs after the restart that failed: {len(errors)} {errors}"
    )
    report(f"pg {case.name} timeline (s from PostgreSQL up): {timeline(evs, outage.up_at)}")
    assert stall < RESUME_WITHIN, f"turn/end {stall:.2f}s after PostgreSQL returned\n{stack.logs()}"
    assert len(requests) <= case.steps + 1
    if case.steps == 2:
        call_id = next(e for e in evs if e["kind"] == "assistant/message")["data"]["tool_calls"][0]["id"]
        assert [e["data"]["call_id"] for e in results] == [call_id], "one result for the owed call"


def wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# -- Redis stopped for 20 s ----------------------------------------------------------------


class SocketWatcher:
    """A program's session socket, kept open (and reopened with ?after=, as
    docs/protocol.md says a client should) on a thread of its own."""

    def __init__(self, stack: Stack, sid: str) -> None:
        self.url = f"ws://127.0.0.1:{stack.http_port}/ws/sessions/{sid}/"
        self.token = stack.token
        self.events: list[tuple[float, dict[str, Any]]] = []  # (time received, event frame)
        self.connects = 0
        self.closes: list[tuple[float, str]] = []
        self.repeats_or_gaps: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-watcher", daemon=True)

    def start(self) -> SocketWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def last_seq(self) -> int:
        return self.events[-1][1]["seq"] if self.events else 0

    def _run(self) -> None:
        from websockets.sync.client import connect

        while not self._stop.is_set():
            try:
                with connect(
                    f"{self.url}?after={self.last_seq()}",
                    additional_headers={"Authorization": f"Bearer {self.token}"},
                    open_timeout=5,
                ) as ws:
                    self.connects += 1
                    while not self._stop.is_set():
                        try:
                            raw = ws.recv(timeout=0.2)
                        except TimeoutError:
                            continue
                        frame = json.loads(raw)
                        if frame.get("type") == "event":
                            if frame["seq"] != self.last_seq() + 1:
                                self.repeats_or_gaps.append(f"{self.last_seq()} -> {frame['seq']}")
                            self.events.append((time.time(), frame))
            except Exception as exc:
                self.closes.append((time.time(), repr(exc)))
                self._stop.wait(0.5)


@dataclass
class RedisOutage:
    sid: str
    text: str
    outage: Outage
    post_status: int
    post_body: str
    post_seconds: float
    logged_during_outage: bool
    model_requests_during_outage: int
    create_status: int  # a new session created during the outage
    evs: list[dict[str, Any]]
    done_at: float  # the outage turn's turn/end was seen through the API
    requests_after: list[float]  # when the model was asked for it
    socket: SocketWatcher


@pytest.fixture(scope="module")
def redis_outage(stack: Stack, api: Api, model: Model) -> RedisOutage:
    """One 20 s Redis outage, shared by the tests below: a turn before it, an
    input posted during it, the turn run after it, and a socket throughout."""
    sid = api.new_session()
    warm = f"before the redis outage {time.monotonic_ns()}"
    assert api.post_input(sid, warm)[0].status_code == 202
    api.wait_events(sid, ended, 20, "the first turn")
    socket = SocketWatcher(stack, sid).start()
    wait(lambda: socket.last_seq() >= len(api.events(sid) or [1]), 10, "the socket's replay")

    down_at = stack.redis.stop()
    time.sleep(1.0)  # the processes have noticed by now
    text = f"posted while redis is down {time.monotonic_ns()}"
    r, seconds = api.post_input(sid, text)
    post_status, post_body = r.status_code, r.text
    evs = api.events(sid) or []
    logged = any(e["kind"] == "user/message" and e["data"].get("text") == text for e in evs)
    try:
        create_status = api.client.post("/api/sessions", json={"profile": PROFILE}).status_code
    except httpx.HTTPError:
        create_status = 0
    time.sleep(max(0.0, down_at + REDIS_OUTAGE - time.time()))
    during = len(model.requests(text))
    up_at = stack.redis.start()
    outage = Outage(down_at, up_at)

    evs = api.wait_events(sid, lambda evs: ended(evs, 2), 60, "the outage turn's turn/end")
    done_at = api.seen_at
    # Anything that would run it a second time (a re-sent wake-up, the sweep) has had its chance.
    time.sleep(2.0)
    wait(lambda: socket.last_seq() >= evs[-1]["seq"], 15, "the socket to deliver the turn")
    socket.stop()
    return RedisOutage(
        sid, text, outage, post_status, post_body, seconds, logged, during, create_status, evs, done_at,
        model.requests(text), socket,
    )  # fmt: skip


def test_input_posted_while_redis_is_down_is_accepted_and_run_once(redis_outage: RedisOutage, stack: Stack) -> None:
    o = redis_outage
    ends = [e for e in o.evs if e["kind"] == "turn/end"]
    done = o.done_at - o.outage.up_at
    report(
        f"redis down {o.outage.length:.1f}s: POST input -> {o.post_status} in {o.post_seconds:.3f}s "
        f"({o.post_body[:120]}); in the log during the outage: {o.logged_during_outage}; "
        f"POST /api/sessions during the outage -> {o.create_status}"
    )
    report(
        f"redis: the outage turn's turn/end {done:.2f}s after Redis answered again; "
        f"model requests for that input {len(o.requests_after)} at {rel(o.requests_after, o.outage.up_at)}"
        f" (during the outage {o.model_requests_during_outage})"
    )
    report(f"redis timeline (s from Redis up): {timeline(o.evs, o.outage.up_at)}")
    assert o.post_status == 202, o.post_body
    assert o.post_seconds < 5.0
    assert o.logged_during_outage, "the accepted input is in the log"
    seqs = [e["seq"] for e in o.evs]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert [e["data"]["status"] for e in ends] == ["completed", "completed"]
    assert o.model_requests_during_outage == 0
    assert len(o.requests_after) == 1, "run once"
    assert done < RESUME_WITHIN, f"turn/end {done:.2f}s after Redis returned\n{stack.logs()}"


def test_session_socket_delivers_the_turn_after_the_redis_outage(redis_outage: RedisOutage) -> None:
    o = redis_outage
    sock = o.socket
    seqs = [frame["seq"] for _, frame in sock.events]
    end_seq = [e for e in o.evs if e["kind"] == "turn/end"][-1]["seq"]
    received = next(t for t, frame in sock.events if frame["seq"] == end_seq)
    report(
        f"socket: {sock.connects} connection(s), closes {[(rel([t], o.outage.up_at), c[:80]) for t, c in sock.closes]}"
        f"; turn/end received {received - o.outage.up_at:.2f}s after Redis up; gaps/repeats {sock.repeats_or_gaps}"
    )
    assert seqs == list(range(1, len(seqs) + 1)), "no gaps, no repeats, across reconnects"
    assert seqs[-1] >= end_seq
    assert not sock.repeats_or_gaps
