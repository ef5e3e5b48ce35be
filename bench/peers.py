"""Terret against its peers, side by side: the same agent loop through each, in one run.

  DATABASE_URL=postgres://root@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/11 \\
      .venv/bin/python bench/peers.py [--rounds 5] [--quick]

The peers (requirements-bench.txt, installed by `make bench`): DBOS Transact
(a workflow of steps), LangGraph with its PostgreSQL checkpointer (a
StateGraph of a model node and a tool node) and LangGraph's prebuilt ReAct
agent (ChatOpenAI, the same checkpointer). Each system has a scratch
database of its own (terret_bench_peers_<system>) on the same PostgreSQL.

The workload: an agent asks ONE local streaming server (tests/fakes/fake_llm.py,
the OpenAI chat-completions SSE wire format) 10 times; each of the first 9
answers asks for a no-op tool, the 10th is text. A step is one model call.
Each system keeps its own default durability. The systems are rotated each
round (5 rounds by default); every figure is the median of the rounds.

Measured, per system:
  - wall per step: agents one after another, from the client's request to
    the agent's end, divided by 10;
  - runtime CPU per step: the CPU of the process(es) running the agents;
  - commits, heap rows and WAL bytes per step, over the same agents: from
    pg_waldump between two LSNs, keeping the records of the system's own
    database (commit records of the transactions that wrote there), so
    other databases' traffic on the server does not count; where pg_waldump
    or the WAL directory is not at hand, pg_stat deltas (commits counted
    there include read-only transactions);
  - 50 and 200 agents at once, with a 1 s model and 2 model calls each:
    wall / ideal (ideal 2 s);
  - kill -9 recovery: for Terret, of the worker driving a turn, another live
    worker taking over; for every system, the only process killed and a
    freshly started one recovering (its boot included): from its start to
    the agent's end.
Every ratio Terret / peer is printed (below 1: Terret is ahead), and so is
what is not equal between the systems (NOT_EQUAL).

--fresh N: only Terret's fresh-process recovery, N times, and the median
(run it in two trees, e.g. a git worktree of the commit before, for an A/B).

--quick: one round, fewer agents, 20 at once with a 0.2 s model: about a
minute on a quiet machine (82 s measured on a loaded one, set-up included),
figures for a smoke test only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# Before bench.turns sets its own defaults: this bench's queue and channels.
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
os.environ.setdefault("TERRET_QUEUE", "bench-peers")
os.environ.setdefault("TERRET_CHANNEL_PREFIX", "bench-peers")
from bench._setup import ROOT, create_database, scratch_database  # noqa: E402
from bench.turns import DEFAULT_LEASES, cpu_seconds, kill, make_sessions, purge, settle, wait_ready  # noqa: E402

SYSTEMS = ["terret", "dbos", "langgraph", "prebuilt"]
LABELS = {
    "terret": "Terret",
    "dbos": "DBOS Transact",
    "langgraph": "LangGraph + PostgresSaver",
    "prebuilt": "LangGraph prebuilt agent",
}
RUNNER = Path(__file__).resolve().parent / "_peer_runner.py"

NOT_EQUAL = """\
What is not equal between the systems:
  - Terret runs agents in Celery worker processes (as the Procfile starts
    them: 2 here, one per core, 200 threads each) and the client reaches
    them through a Redis message; each peer runs its agents inside the one
    process that starts them (no dispatch, no second process, one GIL).
  - Terret's step does more: an event log with streamed deltas' final text,
    usage and cost accounting, daily budgets checked before each model call,
    leases with a liveness lock, per-profile tallies; the peers record their
    own checkpoints only.
  - Terret's client is this bench process (an inject per agent, not counted
    in Terret's CPU); a peer's client is its own runner process (counted).
  - Model client: Terret its own adapter (httpx); DBOS and the LangGraph
    StateGraph a minimal streaming httpx client written here; the prebuilt
    agent langchain-openai's ChatOpenAI (the openai SDK).
  - Durability, each system's default: Terret commits each step's events
    before the next step; DBOS records every step's output before the next;
    LangGraph writes checkpoints with durability="async" (the next node may
    start before the last checkpoint is durable).
  - Recovery: Terret's and DBOS's fresh process finds the unfinished agent
    by itself; LangGraph has no recovery of its own: the fresh process is
    told which thread to resume (invoke(None) from its last checkpoint).
    A live-worker takeover exists in Terret only.
  - Concurrency: Terret's 2 processes use both cores; a peer's single
    process is bound by one GIL (LangGraph: a pool of 20 connections).
  - Commits are counted from the WAL: read-only transactions write no commit
    record and are not counted (pg_stat fallback: they are)."""


# --- the model server ---------------------------------------------------------------------


def respond(body: dict[str, Any]) -> Any:
    """The agent's prompt says how many model calls its loop makes and how
    long each takes ("calls=10 latency=0"): tool calls until then, text last."""
    from tests.fakes.fake_llm import Reply

    text = json.dumps(body["messages"])
    calls = int(re.search(r"calls=(\d+)", text).group(1))  # type: ignore[union-attr]
    latency = float(re.search(r"latency=([\d.]+)", text).group(1))  # type: ignore[union-attr]
    done = sum(1 for m in body["messages"] if m.get("role") == "tool")
    if done < calls - 1:
        return Reply(tool_calls=[("debug.noop", {})], usage=(10, 2, 0.0), latency=latency)
    return Reply(text="done", usage=(10, 2, 0.0), latency=latency)


def prompt(calls: int, latency: float) -> str:
    return f"calls={calls} latency={latency:g}"


# --- the WAL ---------------------------------------------------------------------------------


def _admin() -> Any:
    import psycopg

    return psycopg.connect(os.environ["BENCH_PEERS_ADMIN_URL"], autocommit=True)


WALDUMP = next(
    (p for p in [shutil.which("pg_waldump"), *sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_waldump"))] if p),
    None,
)


class WalWindow:
    """Commits, heap rows and WAL bytes written to one database between start() and stop()."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname
        with _admin() as conn:
            row = conn.execute(
                "SELECT oid, current_setting('data_directory') FROM pg_database WHERE datname = %s", [dbname]
            ).fetchone()
        assert row is not None
        self.oid, datadir = row
        self.waldir = Path(datadir) / "pg_wal"

    def start(self) -> None:
        with _admin() as conn:
            self.lsn0 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]

    def stop(self) -> dict[str, float]:
        with _admin() as conn:
            lsn1 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        out = subprocess.run(
            [str(WALDUMP), "-p", str(self.waldir), "-s", str(self.lsn0), "-e", str(lsn1)],
            capture_output=True,
            text=True,
        ).stdout
        return self._parse(out)

    def _parse(self, out: str) -> dict[str, float]:
        rel = re.compile(r"rel \d+/(\d+)/\d+")
        head = re.compile(
            r"rmgr: (\S+)\s+len \(rec/tot\):\s+(\d+)/\s*(\d+), tx:\s+(\d+), lsn: \S+, prev \S+, desc: (.*)"
        )
        records = []
        ours: set[str] = set()
        for line in out.splitlines():
            m = head.match(line)
            if not m:
                continue
            rmgr, rec, tot, tx, desc = m.groups()
            mine = any(db == str(self.oid) for db in rel.findall(desc))
            if mine and tx != "0":
                ours.add(tx)
            records.append((rmgr, int(rec), int(tot), tx, desc, mine))
        commits = rows = 0
        rec_bytes = tot_bytes = 0
        for rmgr, rec, tot, tx, desc, mine in records:
            counted = mine
            if rmgr == "Transaction" and desc.startswith("COMMIT"):
                subs = re.search(r"subxacts:([\d ]+)", desc)
                if tx in ours or (subs and ours.intersection(subs.group(1).split())):
                    commits += 1
                    counted = True
            elif tx in ours:
                counted = True
            if counted:
                rec_bytes += rec
                tot_bytes += tot
            if mine and rmgr == "Heap" and re.match(r"(INSERT|UPDATE|HOT_UPDATE|DELETE)", desc):
                rows += 1
            if mine and rmgr == "Heap2" and desc.startswith("MULTI_INSERT"):
                n = re.search(r"ntuples: (\d+)", desc)
                rows += int(n.group(1)) if n else 1
        return {"commits": commits, "rows": rows, "wal": tot_bytes, "wal_nofpi": rec_bytes, "source": 1}


class StatWindow:
    """pg_stat deltas: where pg_waldump cannot read the server's WAL. The
    statistics are flushed lazily, so it waits for them; WAL bytes are the
    whole server's (other databases' traffic included)."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname

    def _read(self) -> tuple[int, int, Any]:
        with _admin() as conn:
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        import psycopg

        with psycopg.connect(_db_url(self.dbname), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
            ).fetchone()
            commits = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        return int(commits[0]), int(rows[0]), lsn  # type: ignore[index]

    def start(self) -> None:
        self.c0, self.r0, self.lsn0 = self._read()

    def stop(self) -> dict[str, float]:
        time.sleep(11)  # PostgreSQL flushes a backend's statistics within 10 s of going idle
        c1, r1, lsn1 = self._read()
        with _admin() as conn:
            wal = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", [lsn1, self.lsn0]).fetchone()[0]  # type: ignore[index]
        return {"commits": c1 - self.c0, "rows": r1 - self.r0, "wal": float(wal), "wal_nofpi": float(wal), "source": 0}


def window(dbname: str) -> WalWindow | StatWindow:
    w = WalWindow(dbname)
    if WALDUMP and os.access(w.waldir, os.R_OK):
        return w
    return StatWindow(dbname)


def _db_url(dbname: str) -> str:
    from urllib.parse import urlparse, urlunparse

    return urlunparse(urlparse(os.environ["BENCH_PEERS_ADMIN_URL"])._replace(path=f"/{dbname}"))


# --- Terret ----------------------------------------------------------------------------------


def procfile_worker(name: str, **env: str) -> subprocess.Popen[bytes]:
    """A worker started exactly as the Procfile's `worker` line starts one
    (default settings), on this bench's queue and with its own node name."""
    import shlex

    line = next(x for x in (ROOT / "Procfile").read_text().splitlines() if x.startswith("worker:"))
    argv = shlex.split(line.split(":", 1)[1])
    assert argv[:3] == ["python", "-m", "terret_site.worker"], argv
    argv = [sys.executable, *argv[1:]]
    argv[argv.index("-Q") + 1] = os.environ["TERRET_QUEUE"]
    argv[argv.index("-n") + 1] = f"{name}@%h"
    argv[argv.index("--loglevel") + 1] = os.environ.get("BENCH_WORKER_LOG", "WARNING")
    log = open(f"/tmp/terret-bench-peers-{name}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(
        argv, cwd=ROOT, env=dict(os.environ, **env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


class Terret:
    name = "terret"

    def __init__(self, fake: Any, dbname: str) -> None:
        self.fake, self.dbname = fake, dbname
        self.env = {"TERRET_LLM_BASE_URL": fake.base_url, "TERRET_LLM_API_KEY": "bench", **DEFAULT_LEASES}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.n = 0

    def start(self) -> None:
        self.n += 1
        self.procs = [procfile_worker(f"peers{self.n}w{i}", **self.env) for i in range(2)]
        for p in self.procs:
            wait_ready(p, workers=len(self.procs))
        settle(self.procs)
        self.seq([prompt(2, 0)])  # warm-up, as every system gets one

    def stop(self) -> None:
        for p in self.procs:
            kill(p)
        self.procs = []
        purge()

    def _sessions(self, n: int) -> list[Any]:
        return make_sessions(n, f"peers-{uuid.uuid4().hex[:8]}", ["debug.noop"])

    def seq(self, prompts: list[str]) -> tuple[list[float], float]:
        from sessions_app import services

        sessions = self._sessions(len(prompts))
        cpu0 = sum(cpu_seconds(p.pid) for p in self.procs)
        walls = []
        for s, text in zip(sessions, prompts, strict=True):
            t0 = time.time()
            services.inject(s.id, text, wake=True)
            walls.append(_turn_end(s.id) - t0)
        return walls, sum(cpu_seconds(p.pid) for p in self.procs) - cpu0

    def burst(self, prompts: list[str]) -> tuple[float, float]:
        from bench.turns import _admit, last_turn_end, wait_turn_ends

        sessions = self._sessions(len(prompts))
        ids = [s.id for s in sessions]
        text = prompts[0]
        cpu0 = sum(cpu_seconds(p.pid) for p in self.procs)
        t0 = time.time()
        chunks = [ids[k::8] for k in range(8)]
        threads = [threading.Thread(target=_admit_text, args=(c, text, _admit)) for c in chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_turn_ends(ids, poll=0.25)
        return last_turn_end(ids) - t0, sum(cpu_seconds(p.pid) for p in self.procs) - cpu0

    def takeover(self) -> float:
        """kill -9 of the worker driving a turn (mid-stream) -> turn/end by the other one."""
        from bench.turns import _holder

        session, release = self._hanging()
        driver = _holder(session.id, self.procs)
        killed = time.time()
        kill(driver)
        self.procs.remove(driver)
        try:
            return _turn_end(session.id, timeout=60) - killed
        finally:
            release.set()

    def fresh(self) -> float:
        """The only worker killed mid-turn; a fresh one started: its start -> turn/end."""
        session, release = self._hanging()
        for p in self.procs:
            kill(p)
        started = time.time()
        self.procs = [procfile_worker(f"peers{self.n}fresh", **self.env)]
        try:
            took = _turn_end(session.id, timeout=60) - started
            self.fresh_cpu = cpu_seconds(self.procs[0].pid)  # its boot and the turn (and a few ms after)
            return took
        finally:
            release.set()

    def _hanging(self) -> tuple[Any, threading.Event]:
        from sessions_app import services
        from tests.fakes.fake_llm import Reply

        release = threading.Event()
        (session,) = self._sessions(1)
        asked = len(self.fake.requests)
        self.fake.script(Reply(text="never ends", hang=release))
        services.inject(session.id, prompt(1, 0), wake=True)
        _wait_requests(self.fake, asked)
        return session, release


def _admit_text(ids: list[Any], text: str, _admit: Any) -> None:
    from django.db import connection

    from sessions_app import services

    try:
        for i in ids:
            services.inject(i, text, wake=True)
    finally:
        connection.close()


def _turn_end(session_id: Any, timeout: float = 120) -> float:
    """Epoch seconds of the session's turn/end, from the log (polling costs no precision)."""
    from sessions_app.models import Event

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = Event.objects.filter(session_id=session_id, kind="turn/end").values_list("created_at", flat=True).first()
        if at is not None:
            return float(at.timestamp())
        time.sleep(0.01)
    raise SystemExit(f"no turn/end for {session_id} within {timeout}s")


def _wait_requests(fake: Any, before: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(fake.requests) <= before:
        if time.monotonic() > deadline:
            raise SystemExit("the model was never asked")
        time.sleep(0.01)
    time.sleep(0.2)  # mid-stream


# --- the peers ---------------------------------------------------------------------------------


class Peer:
    """A peer system in its own runner process (bench/_peer_runner.py)."""

    def __init__(self, name: str, fake: Any, dbname: str) -> None:
        self.name, self.fake, self.dbname = name, fake, dbname
        self.url = _db_url(dbname)
        self.proc: subprocess.Popen[str] | None = None

    def _spawn(self, *extra: str) -> subprocess.Popen[str]:
        log = open(f"/tmp/terret-bench-peers-{self.name}.log", "ab")  # noqa: SIM115
        return subprocess.Popen(
            [sys.executable, str(RUNNER), self.name, self.url, self.fake.base_url, *extra],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )

    def _ask(self, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        if payload is not None:
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name} runner died: see /tmp/terret-bench-peers-{self.name}.log")
        return dict(json.loads(line))

    def start(self) -> None:
        self.proc = self._spawn()
        self._ask()  # ready
        self.seq([prompt(2, 0)])  # warm-up

    def stop(self) -> None:
        if self.proc is not None:
            kill(self.proc)  # type: ignore[arg-type]
            self.proc = None

    def seq(self, prompts: list[str]) -> tuple[list[float], float]:
        r = self._ask({"op": "seq", "prompts": prompts})
        return r["walls"], r["cpu"]

    def burst(self, prompts: list[str]) -> tuple[float, float]:
        r = self._ask({"op": "burst", "prompts": prompts})
        return r["wall"], r["cpu"]

    def fresh(self) -> float:
        from tests.fakes.fake_llm import Reply

        release = threading.Event()
        agent = str(uuid.uuid4())
        asked = len(self.fake.requests)
        self.fake.script(Reply(text="never ends", hang=release))
        self._ask({"op": "start", "id": agent, "prompt": prompt(1, 0)})
        _wait_requests(self.fake, asked)
        self.stop()
        started = time.time()
        self.proc = self._spawn("--recover", agent)
        try:
            done = self._ask()
            self.fresh_cpu = float(done["cpu"])
            return float(done["done"]) - started
        finally:
            release.set()
            self.stop()


# --- the run ---------------------------------------------------------------------------------


def one_round(system: Any, args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    system.start()
    try:
        w = window(system.dbname)
        w.start()
        walls, cpu = system.seq([prompt(args.calls, 0)] * args.agents)
        wal = w.stop()
        steps = args.calls * args.agents
        out["wall_ms"] = statistics.median(walls) * 1000 / args.calls
        out["cpu_ms"] = cpu * 1000 / steps
        out["commits"] = wal["commits"] / steps
        out["rows"] = wal["rows"] / steps
        out["wal"] = wal["wal"] / steps
        out["wal_nofpi"] = wal["wal_nofpi"] / steps
        for n in args.at_once:
            wall, _cpu = system.burst([prompt(args.calls_b, args.latency_b)] * n)
            out[f"at_once_{n}"] = wall / (args.calls_b * args.latency_b)
        if system.name == "terret":
            out["takeover"] = system.takeover()
        out["fresh"] = system.fresh()
        # CPU seconds the fresh process spent until then: what its wall time would be on an idle core
        out["fresh_cpu"] = system.fresh_cpu
    finally:
        system.stop()
    return out


def measures(args: argparse.Namespace) -> list[tuple[str, str]]:
    return [
        ("wall_ms", "wall per step (ms)"),
        ("cpu_ms", "runtime CPU per step (ms)"),
        ("commits", "commits per step"),
        ("rows", "heap rows written per step"),
        ("wal", "WAL bytes per step"),
        ("wal_nofpi", "WAL bytes per step, full-page images left out"),
        *[
            (f"at_once_{n}", f"{n} agents at once, {args.latency_b:g} s model x {args.calls_b}, wall / ideal")
            for n in args.at_once
        ],
        ("takeover", "kill -9, a live worker takes over (s)"),
        ("fresh", "kill -9, a freshly started process recovers (s)"),
        ("fresh_cpu", "  the fresh process's CPU until then (s)"),
    ]


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    names = [s for s in SYSTEMS if s in results]
    med = {s: {k: statistics.median([r[k] for r in results[s]]) for k in results[s][0]} for s in names}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nmedians of {args.rounds} round(s); load average now {load} on {os.cpu_count()} cores (a loaded machine")
    print("inflates every wall time: compare the ratios, which come from the same rounds):")
    head = f"{'measure':<58}" + "".join(f"{LABELS[s][:26]:>28}" for s in names)
    print(head)
    for key, label in measures(args):
        cells = []
        for s in names:
            v = med[s].get(key)
            cells.append(f"{'—' if v is None else _fmt(v):>28}")
        print(f"{label:<58}" + "".join(cells))
    print("\nratios Terret / peer (below 1: Terret ahead):")
    for key, label in measures(args):
        t = med.get("terret", {}).get(key)
        if t is None:
            continue
        parts = [f"{LABELS[s]} {t / med[s][key]:.2f}" for s in names[1:] if med[s].get(key)]
        print(f"  {label.strip()}: " + (", ".join(parts) or f"{_fmt(t)}, Terret only"))
    src = "pg_waldump, this database's records only" if WALDUMP else "pg_stat deltas"
    print(f"\n(commits, rows and WAL from {src})")
    print(NOT_EQUAL)


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def fresh_only(n: int, dbname: str) -> int:
    """kill -9 of the only worker mid-turn, a fresh one started, n times: each start -> turn/end."""
    from tests.fakes.fake_llm import FakeLLM

    walls, cpus = [], []
    with FakeLLM(respond) as fake:
        system = Terret(fake, dbname)
        system.start()
        try:
            for _ in range(n):
                walls.append(system.fresh())
                cpus.append(system.fresh_cpu)
                print(f"  fresh recovery {walls[-1]:.3f} s, its CPU {cpus[-1]:.3f} s", flush=True)
        finally:
            system.stop()
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"median of {n}: {wall:.3f} s, CPU {cpu:.3f} s (fastest {min(walls):.3f} s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--agents", type=int, default=10, help="agents one after another, per round")
    parser.add_argument("--calls", type=int, default=10, help="model calls per agent")
    parser.add_argument("--at-once", type=int, nargs="*", default=[50, 200])
    parser.add_argument("--calls-b", type=int, default=2, help="model calls per agent, agents at once")
    parser.add_argument("--latency-b", type=float, default=1.0, help="seconds per model call, agents at once")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=SYSTEMS)
    parser.add_argument("--quick", action="store_true", help="one short round: a smoke test (about a minute)")
    parser.add_argument(
        "--fresh", type=int, metavar="N", help="only Terret's fresh-process recovery, N times (for an A/B of the boot)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.agents, args.at_once, args.latency_b = 1, 3, [20], 0.2
    if "terret" not in args.systems:
        args.systems.insert(0, "terret")  # the ratios are Terret's

    from urllib.parse import urlparse, urlunparse

    base = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/test")
    os.environ["BENCH_PEERS_ADMIN_URL"] = urlunparse(urlparse(base)._replace(path="/postgres"))
    dbs = {s: f"terret_bench_peers_{s}" for s in args.systems}
    for s in args.systems:
        if s != "terret":
            create_database(dbs[s])
    scratch_database(dbs["terret"])
    purge()

    from tests.fakes.fake_llm import FakeLLM

    if args.fresh:
        return fresh_only(args.fresh, dbs["terret"])
    results: dict[str, list[dict[str, float]]] = {s: [] for s in args.systems}
    with FakeLLM(respond) as fake:
        systems = {s: Terret(fake, dbs[s]) if s == "terret" else Peer(s, fake, dbs[s]) for s in args.systems}
        for r in range(args.rounds):
            order = args.systems[r % len(args.systems) :] + args.systems[: r % len(args.systems)]
            print(f"round {r + 1}/{args.rounds}: {', '.join(order)}", flush=True)
            for s in order:
                t0 = time.perf_counter()
                got = one_round(systems[s], args)
                results[s].append(got)
                print(f"  {s:<10} " + " ".join(f"{k}={_fmt(v)}" for k, v in got.items()), end="", flush=True)
                print(f"  ({time.perf_counter() - t0:.0f}s)", flush=True)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
