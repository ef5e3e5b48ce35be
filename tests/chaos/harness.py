"""The chaos pass's harness: one private stack (tests/stack.py) for every
drill, a fake model that counts requests per input, and the moves the
drills make against the stack's processes (kill -9, SIGTERM, SIGSTOP,
restarts), each timed. Fixtures in conftest.py; the checks in invariants.py.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.chaos import invariants
from tests.chaos.invariants import Ev, Probe, RoundReport
from tests.fakes.fake_llm import Reply
from tests.fakes.planned import Plan, PlannedModel, last_role
from tests.helpers import wait_for
from tests.stack import AppProcess, Stack

PROFILE = "chaos"
# Failpoint for the "after the assistant message" kill: workspace.write
# pauses this long with its intent committed (sessions_app/runtime/failpoints.py).
# Every worker has it, so the re-run pauses too; the drill subtracts it.
WRITE_PAUSE = 2.0
FAILPOINTS = f"after_intent:workspace.write={WRITE_PAUSE}"
PROFILE_FIELDS: dict[str, Any] = {
    "roles": {"main": "test/model"},
    "builtin_tools": ["debug.sleep", "debug.noop", "debug.charge", "workspace.write"],
    "allow_floor": ["*"],
    # debug.charge asks a human (the "parked" kill); the write runs when called.
    "approvals": {"workspace.write": "never", "debug.charge": "always"},
}
# The owned-work drill's profile (test_tasks.py): background and foreground commands and
# subagents (its own profile as the child's), no reviewer.
TASK_PROFILE = "chaos-tasks"
TASK_PROFILE_FIELDS: dict[str, Any] = {
    "roles": {"main": "test/model"},
    "builtin_tools": ["task.start", "task.wait", "task.status", "task.cancel", "debug.noop"],
    "allow_floor": ["*"],
    "command_allow": ["sh"],
    "approvals": {"task.start": "never", "task.cancel": "never"},
}
SUMMARY: list[str] = []


def summary(drill: str, **figures: Any) -> str:
    """One line of figures per drill, printed with the pass's summary (conftest.py)."""
    parts = " ".join(f"{k}={_fmt(v)}" for k, v in figures.items())
    line = f"[chaos] {drill}: {parts}"
    SUMMARY.append(line)
    print(line, flush=True)
    return line


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


@functools.cache
def seed() -> int:
    """TERRET_CHAOS_SEED replays a pass's order and timings; otherwise a fresh
    one, drawn once per run (the drills' order is drawn at collection)."""
    raw = os.environ.get("TERRET_CHAOS_SEED", "").strip()
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


def charges(stack: Stack, sid: str) -> int:
    """Executions of debug.charge in the session's workspace, as the tool recorded them."""
    path = stack.root / "workspaces" / uuid.UUID(sid).hex / "charges.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


# -- the fake model's side -------------------------------------------------------------------


class Model(PlannedModel):
    """The drills' responder (tests/fakes/planned.py): an unplanned step after
    a tool result answers "done"."""

    def __init__(self) -> None:
        super().__init__(after_tool="done")


def first_then(first: Reply, then: Reply) -> Plan:
    """`first` for the input's first request of a step, `then` for a re-run of it."""
    return lambda n, body: first if n == 0 else then


def tool_then_final(call: tuple[str, dict[str, Any]], first: Reply | None = None, final: Reply | None = None) -> Plan:
    """Step 1 calls `call`; step 2 (after its result) answers. `first`/`final`
    shape each step's reply the first time it is asked; a re-run is answered at once."""
    asked: dict[str, int] = {"call": 0, "final": 0}

    def plan(n: int, body: dict[str, Any]) -> Reply:
        if last_role(body) == "tool":
            asked["final"] += 1
            base = final if final is not None and asked["final"] == 1 else Reply(text="done")
            return Reply(**{**base.__dict__, "text": base.text or "done"})
        asked["call"] += 1
        base = first if first is not None and asked["call"] == 1 else Reply()
        return Reply(**{**base.__dict__, "text": None, "tool_calls": [call]})

    return plan


def streamed(seconds: float, *, delay: float = 0.2) -> Reply:
    return Reply(text=" ".join(f"w{i}" for i in range(max(1, int(seconds / delay)))), chunk_delay=delay)


# -- the harness ---------------------------------------------------------------------------------


@dataclass
class Chaos:
    stack: Stack
    model: Model
    probe: Probe
    rng: random.Random
    seed: int
    client: httpx.Client = field(init=False)
    receipts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client = self.stack.client(timeout=15)

    @property
    def db(self) -> str:
        return self.stack.postgres.url()

    # -- the API, as a client uses it

    def new_session(self, profile: str = PROFILE) -> str:
        r = self._retrying("POST", "/api/sessions", json={"profile": profile})
        assert r.status_code == 201, r.text
        sid = str(r.json()["id"])
        self.receipts[sid] = []
        return sid

    def post(self, sid: str, text: str, plan: Plan | None = None) -> dict[str, Any]:
        """Send input; its receipt, remembered for the input check."""
        if plan is not None:
            self.model.plans[text] = plan
        r = self._retrying("POST", f"/api/sessions/{sid}/inputs", json={"text": text})
        assert r.status_code == 202, r.text
        receipt: dict[str, Any] = r.json()
        self.receipts.setdefault(sid, []).append(receipt)
        return receipt

    def try_post(self, sid: str, text: str) -> int:
        """One attempt, no retry (during an outage): the status, 0 for no answer."""
        try:
            r = self.client.post(f"/api/sessions/{sid}/inputs", json={"text": text}, timeout=5)
        except httpx.HTTPError:
            return 0
        if r.status_code == 202:
            self.receipts.setdefault(sid, []).append(r.json())
        return r.status_code

    def approve(self, sid: str, call_id: str) -> None:
        r = self._retrying("POST", f"/api/sessions/{sid}/approvals/{call_id}", json={"verdict": "approve"})
        assert r.status_code == 200, r.text

    def _retrying(self, method: str, path: str, timeout: float = 30, **kw: Any) -> httpx.Response:
        """A request retried on 503 or no answer (the API says 503 while its pool reconnects)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = self.client.request(method, path, **kw)
                if r.status_code != 503 or time.monotonic() > deadline:
                    return r
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    # -- the log, read from the private database

    def events(self, sid: str) -> list[Ev]:
        return invariants.read_events(self.db, sid)

    def has(self, sid: str, kind: str, count: int = 1) -> bool:
        rows = invariants.query(
            self.db, f"SELECT count(*) FROM {invariants.EVENT_TABLE} WHERE session_id = %s AND kind = %s", [sid, kind]
        )
        return int(rows[0][0]) >= count

    def first_at(self, sid: str, kind: str, nth: int = 1) -> float:
        """When the session's nth event of `kind` was made (its created_at)."""
        found = [e.at for e in self.events(sid) if e.kind == kind]
        return found[nth - 1]

    def wait_kind(self, sid: str, kind: str, count: int = 1, timeout: float = 60) -> float:
        """Wait until the log holds `count` events of `kind`; the last one's created_at."""
        wait_until(lambda: self.has(sid, kind, count), timeout, f"{count} {kind} in {sid}", self.stack)
        return self.first_at(sid, kind, count)

    def settle(self, sids: list[str], timeout: float = 60) -> None:
        for sid in sids:
            settled = functools.partial(invariants.settled, self.db, sid)
            wait_until(settled, timeout, f"session {sid} to settle", self.stack)

    def check(self, sids: list[str] | None = None, timeout: float = 60) -> RoundReport:
        """Settle the round's sessions, then every invariant (invariants.check_round)."""
        chosen = list(self.receipts) if sids is None else sids
        self.settle(chosen, timeout)
        return invariants.check_round(self.db, self.probe, {sid: self.receipts.get(sid, []) for sid in chosen})

    # -- the workers

    def alive(self) -> list[AppProcess]:
        return [w for w in self.stack.workers if w.alive()]

    def driver_pid(self, sid: str) -> str:
        """The session's lease owner, "" when no worker holds it."""
        return str(invariants.session_row(self.db, sid)["lease_owner"] or "")

    def driver(self, sid: str, timeout: float = 30) -> AppProcess:
        """The worker whose process holds the session's lease (owner host:pid:thread:nonce)."""

        def holder() -> AppProcess | None:
            owner = invariants.session_row(self.db, sid)["lease_owner"]
            if not owner:
                return None
            pid = int(owner.split(":")[1])
            return next((w for w in self.stack.workers if w.pid == pid and w.alive()), None)

        found: AppProcess = wait_until(holder, timeout, f"a worker holding {sid}'s lease", self.stack)
        return found

    def signal(self, worker: AppProcess, sig: signal.Signals) -> float:
        """Send `sig` to the worker's process group; the moment it was sent."""
        at = time.time()
        os.killpg(worker.pid, sig)
        if sig == signal.SIGKILL:
            worker.proc.wait(10)
        return at

    def replace(self, worker: AppProcess) -> AppProcess:
        """A fresh worker for one that is gone (not waited for: it boots meanwhile)."""
        assert not worker.alive()
        return self.stack.add_worker(wait=False)

    def ensure_workers(self, n: int = 2, timeout: float = 60) -> list[AppProcess]:
        """At least `n` live, ready workers (starting what is missing)."""
        while len(self.alive()) < n:
            self.stack.add_worker(wait=False)
        for w in self.alive():
            self.stack.wait_worker_ready(w, timeout)
        return self.alive()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, stack: Stack | None = None) -> Any:
    """tests.helpers.wait_for, with the stack's process logs on a timeout."""
    try:
        return wait_for(predicate, timeout=timeout, what=f"{what} (after {timeout}s)")
    except AssertionError as exc:
        logs = f"\n{stack.logs()}" if stack is not None else ""
        raise AssertionError(f"{exc}{logs}") from None


def timeline(events: list[Ev], origin: float) -> str:
    """seq:kind@seconds from `origin`, for failure messages."""
    return ", ".join(f"{e.seq}:{e.kind}@{e.at - origin:+.2f}" for e in events)


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS), KiB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# -- a session socket kept open across faults ------------------------------------------------------


class SocketWatcher:
    """A client of /ws/sessions/{id}/ on a thread of its own, reconnecting with
    ?after=<last seq it got> whenever the socket closes (docs/protocol.md)."""

    def __init__(self, stack: Stack, sid: str) -> None:
        self.url = f"ws://127.0.0.1:{stack.http_port}/ws/sessions/{sid}/"
        self.token = stack.token
        self.seqs: list[int] = []
        self.connects = 0
        self.closes: list[float] = []
        self.gaps: list[str] = []
        self._stop = threading.Event()
        self._drop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-socket", daemon=True)

    def start(self) -> SocketWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def last(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    def drop(self) -> None:
        """Close the client's side (a dropped network): it reconnects with ?after=."""
        self._drop.set()

    def _run(self) -> None:
        from websockets.sync.client import connect

        while not self._stop.is_set():
            try:
                with connect(
                    f"{self.url}?after={self.last()}",
                    additional_headers={"Authorization": f"Bearer {self.token}"},
                    open_timeout=5,
                ) as ws:
                    self.connects += 1
                    while not self._stop.is_set() and not self._drop.is_set():
                        try:
                            frame = json.loads(ws.recv(timeout=0.2))
                        except TimeoutError:
                            continue
                        if frame.get("type") == "event":
                            if frame["seq"] != self.last() + 1:
                                self.gaps.append(f"{self.last()} -> {frame['seq']}")
                            self.seqs.append(frame["seq"])
                if self._drop.is_set():
                    self._drop.clear()
                    self.closes.append(time.time())
            except Exception:
                self.closes.append(time.time())
                self._stop.wait(0.3)
