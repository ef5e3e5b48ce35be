"""Faults outside Terret, from outside (docs/runtime.md, "Faults outside Terret").

A private stack (tests/stack.py: our own PostgreSQL cluster and redis-server,
daphne, two Celery workers with the default lease, sweep and pool settings,
the fake model server in this process) is driven through the HTTP API, while
its Redis is stopped for 20 s and its PostgreSQL is restarted mid-turn:

- input posted while Redis is down is answered 202 at once and is in the log;
  its turn runs, once, a few seconds after Redis is back; a session socket
  open across the outage delivers that turn's events; a turn that was
  streaming when Redis stopped completes meanwhile;
- a PostgreSQL restart stalls a turn by about the restart's length: the turn
  completes a few seconds after the database accepts connections again (and
  no later than its own work plus one backoff step), with one turn/end and a
  gapless log, and at most the interrupted step redone.

Commit times are read from the private database directly (the API answers
503 for a moment after a restart). The measured figures are printed at the
end of the module with -s. The machine's shared PostgreSQL and Redis are
never touched. Marked `worker` so it runs in the PostgreSQL pass; skipped
where the PostgreSQL server binaries or redis-server are missing (a failure
with TERRET_NO_SKIP=1).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests import stack as stack_module
from tests.fakes.fake_llm import FakeLLM, Reply
from tests.fakes.planned import Plan, PlannedModel
from tests.helpers import wait_for
from tests.stack import Outage, Stack

pytestmark = [pytest.mark.worker]

PROFILE = "outage"
# How soon after a service returns its turns must have ended.
RESUME_WITHIN = 8.0
# A drive waiting for the database backs off 0.25 s doubling to 2 s
# (docs/runtime.md), so it may notice the database's return up to one 2 s
# step late: "stalls a turn by about the restart's length" allows no more.
EXTRA_STALL = 2.5
# The 20 s. Celery's consumer retries the broker 2, 4, 6, 8, … s
# apart (kombu's ensure_connection), i.e. about 0.2, 2.2, 6.2, 12.2, 20.2, 30.2 s
# into the outage, so the length decides how long a worker stays away after
# Redis returns: TERRET_TEST_REDIS_OUTAGE_SECONDS=22 shows it.
REDIS_OUTAGE = float(os.environ.get("TERRET_TEST_REDIS_OUTAGE_SECONDS") or 20.0)
REPORT: list[str] = []


def report(line: str) -> None:
    """A measured figure: printed at the end of the module (run with -s to see them)."""
    REPORT.append(line)


Model = PlannedModel


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


def committed_at(stack: Stack, sid: str, kind: str, count: int, timeout: float) -> float:
    """When the session's log first held `count` events of `kind`, read from
    the private database directly (time.time(), polled every 50 ms): the API
    answers 503 for a moment after a restart (while its pool drops dead
    connections), which would blur the figure."""
    import psycopg

    from sessions_app.models import Event

    sql = f"SELECT count(*) FROM {Event._meta.db_table} WHERE session_id = %s AND kind = %s"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(stack.postgres.url(), connect_timeout=1, autocommit=True) as conn:
                while time.monotonic() < deadline:
                    row = conn.execute(sql, [sid, kind]).fetchone()
                    if row and row[0] >= count:
                        return time.time()
                    time.sleep(0.05)
        except psycopg.Error:
            time.sleep(0.05)
    raise AssertionError(f"no {count} {kind} in {sid} after {timeout}s")


def rel(times: list[float], origin: float) -> list[float]:
    return [round(t - origin, 2) for t in times]


def timeline(evs: list[dict[str, Any]], origin: float) -> str:
    return ", ".join(f"{e['seq']}:{e['kind']}@{at(e) - origin:+.2f}" for e in evs)


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
    done_at: float  # the outage turn's turn/end was committed (read from the database)
    requests_after: list[float]  # when the model was asked for it
    socket: SocketWatcher
    inflight_evs: list[dict[str, Any]]  # a turn that was streaming when Redis stopped
    inflight_done_at: float
    inflight_requests: int
    workers_alive: list[bool]


@pytest.fixture(scope="module")
def redis_outage(stack: Stack, api: Api, model: Model) -> RedisOutage:
    """One 20 s Redis outage, shared by the tests below: a turn before it, an
    input posted during it, the turn run after it, and a socket throughout;
    on another session, a turn that was streaming when Redis stopped."""
    sid = api.new_session()
    warm = f"before the redis outage {time.monotonic_ns()}"
    assert api.post_input(sid, warm)[0].status_code == 202
    head = len(api.wait_events(sid, ended, 20, "the first turn"))
    socket = SocketWatcher(stack, sid).start()
    wait_for(lambda: socket.last_seq() >= head, 10, "the socket's replay")
    inflight_sid = api.new_session()
    inflight = f"streaming when redis stops {time.monotonic_ns()}"
    model.plans[inflight] = streamed(3.0)
    assert api.post_input(inflight_sid, inflight)[0].status_code == 202
    wait_for(lambda: model.requests(inflight), 15, "the in-flight turn's model request")

    down_at = stack.redis.stop()
    try:
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
        try:
            inflight_done_at = committed_at(stack, inflight_sid, "turn/end", 1, down_at + REDIS_OUTAGE - time.time())
        except AssertionError:
            inflight_done_at = float("inf")  # not during the outage: the test says so
        time.sleep(max(0.0, down_at + REDIS_OUTAGE - time.time()))
        during = len(model.requests(text))
    finally:
        up_at = stack.redis.start()
    outage = Outage(down_at, up_at)

    done_at = committed_at(stack, sid, "turn/end", 2, 60)
    evs = api.wait_events(sid, lambda evs: ended(evs, 2), 30, "the outage turn's turn/end")
    # Anything that would run it a second time (a re-sent wake-up, the sweep) has had its chance.
    time.sleep(2.0)
    wait_for(lambda: socket.last_seq() >= evs[-1]["seq"], 15, "the socket to deliver the turn")
    socket.stop()
    return RedisOutage(
        sid, text, outage, post_status, post_body, seconds, logged, during, create_status, evs, done_at,
        model.requests(text), socket, api.events(inflight_sid) or [], inflight_done_at,
        len(model.requests(inflight)), [w.alive() for w in stack.workers],
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
        f"redis: the outage turn's turn/end committed {done:.2f}s after Redis answered again; "
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


def test_turn_streaming_when_redis_stops_completes_during_the_outage(redis_outage: RedisOutage) -> None:
    o = redis_outage
    report(
        f"redis: a turn streaming when Redis stopped committed turn/end {o.inflight_done_at - o.outage.down_at:.2f}s"
        f" into the outage; model requests {o.inflight_requests}; workers alive after the outage {o.workers_alive}"
    )
    assert_one_clean_turn(o.inflight_evs)
    assert o.inflight_done_at < o.outage.up_at, "the turn needs no broker once it runs"
    assert o.inflight_requests == 1
    assert all(o.workers_alive)


# -- PostgreSQL restarted mid-turn -----------------------------------------------------


def streamed(seconds: float) -> Plan:
    """Text streamed over about `seconds` the first time; at once when redone."""

    def plan(n: int, body: dict[str, Any]) -> Reply:
        if n == 0:
            return Reply(text=" ".join(f"w{i}" for i in range(int(seconds / 0.2))), chunk_delay=0.2)
        return Reply(text="redone")

    return plan


def tool_then_final(n: int, body: dict[str, Any]) -> Reply:
    """A 1 s tool call, then (after its result) the final answer."""
    if body["messages"][-1].get("role") == "tool":
        return Reply(text="done")
    return Reply(tool_calls=[("debug.sleep", {"seconds": 1})])


@dataclass
class PgCase:
    name: str
    plan: Plan
    steps: int  # model steps the turn takes when nothing fails
    busy: float  # seconds from its first model request until it next needs the database (a stream, a tool)
    redo: float  # seconds of that work done again after the restart (a tool's result was not committed)
    gap: float  # seconds PostgreSQL stays down
    trigger: str  # what the test waits for before stopping PostgreSQL
    delay: float  # then this long
    burst: int = 0  # turns run at once just before (the workers' pools grow to serve them)


PG_CASES = [
    # The step's model reply (about 3 s) finishes while the database is down:
    # its commit is refused, the drive backs off until the database answers.
    PgCase("down-across-the-commit", streamed(3.0), 1, busy=3.0, redo=0.0, gap=3.0, trigger="model-request", delay=1.0),
    # A fast restart (stop, start at once) while a tool runs: the database is
    # back before the tool's result is committed, on a pool of dead connections.
    PgCase("fast-restart-between-steps", tool_then_final, 2, busy=1.0, redo=1.0, gap=0.0, trigger="tool", delay=0.2),
    # The same on workers that have just served a burst of turns: their pools
    # grew to serve it, so more idle connections are dead after the restart.
    PgCase(
        "fast-restart-after-a-burst",
        tool_then_final,
        2,
        busy=1.0,
        redo=1.0,
        gap=0.0,
        trigger="tool",
        delay=0.2,
        burst=16,
    ),
]


def run_burst(api: Api, n: int) -> None:
    """`n` sessions' turns at once, through the API, until all have ended."""
    with ThreadPoolExecutor(8) as pool:
        sids = list(pool.map(lambda _: api.new_session(), range(n)))
        receipts = list(pool.map(lambda sid: api.post_input(sid, f"burst {sid}")[0].status_code, sids))
        assert receipts == [202] * n
        list(pool.map(lambda sid: api.wait_events(sid, ended, 30, "a burst turn"), sids))


def pooled_connections(stack: Stack) -> int:
    """Client backends of the app's pools on the private cluster (not the liveness connections)."""
    import psycopg

    with psycopg.connect(stack.postgres.url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND application_name <> 'terret-liveness' AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def drive_retries(stack: Stack, sid: str) -> int:
    """How often the workers logged a drive of `sid` waiting for the database."""
    return sum(w.output().count(f"drive of {sid}: database unavailable") for w in stack.workers)


@pytest.mark.parametrize("case", PG_CASES, ids=[c.name for c in PG_CASES])
def test_postgres_restart_mid_turn_resumes_within_seconds(stack: Stack, api: Api, model: Model, case: PgCase) -> None:
    if case.burst:
        run_burst(api, case.burst)
    sid = api.new_session()
    text = f"pg restart {case.name} {time.monotonic_ns()}"
    model.plans[text] = case.plan
    r, _ = api.post_input(sid, text)
    assert r.status_code == 202, r.text

    assert case.trigger in ("model-request", "tool")
    if case.trigger == "model-request":
        wait_for(lambda: model.requests(text), 15, "the model request")
    else:
        api.wait_events(sid, lambda evs: any(e["kind"] == "assistant/message" for e in evs), 15, "the tool call")
    time.sleep(case.delay)
    pooled = pooled_connections(stack)
    outage: Outage = stack.postgres.restart(gap=case.gap)
    n_status = len(api.statuses)

    # An event's `at` is when it was made, which for a buffered append is before its commit.
    done_at = committed_at(stack, sid, "turn/end", 1, 60)
    evs = api.wait_events(sid, ended, 30, "turn/end through the API")
    stall = done_at - outage.up_at
    requests = model.requests(text)
    # Beyond what the turn had to do anyway: from when the database was back
    # and the turn needed it again, less the work it had to redo.
    extra = done_at - max(outage.up_at, requests[0] + case.busy) - case.redo
    errors = [s for s in api.statuses[n_status:] if s != 200]
    results = [e for e in evs if e["kind"] == "tool/result"]
    report(
        f"pg {case.name}: down {outage.length:.2f}s; turn/end committed {stall:.2f}s after PostgreSQL accepted again, "
        f"{extra:.2f}s beyond the turn's own work; "
        f"drive retries {drive_retries(stack, sid)}; pooled connections before the restart {pooled}; "
        f"model requests {len(requests)} (steps {case.steps}) at {rel(requests, outage.up_at)}; "
        f"tool results {len(results)}; API GETs after the restart that failed: {len(errors)} {errors}"
    )
    report(f"pg {case.name} timeline (s from PostgreSQL up): {timeline(evs, outage.up_at)}")
    assert_one_clean_turn(evs)
    assert stall < RESUME_WITHIN, f"turn/end {stall:.2f}s after PostgreSQL returned\n{stack.logs()}"
    assert extra < EXTRA_STALL, f"the turn stalled {extra:.2f}s beyond its own work\n{stack.logs()}"
    assert len(requests) <= case.steps + 1
    # A request that meets the dead pool is told to retry (503, Retry-After), never a 500.
    assert set(errors) <= {503}, errors
    if case.steps == 2:
        call_id = next(e for e in evs if e["kind"] == "assistant/message")["data"]["tool_calls"][0]["id"]
        assert [e["data"]["call_id"] for e in results] == [call_id], "one result for the owed call"
