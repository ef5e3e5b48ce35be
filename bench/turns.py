"""Turn runtime benchmark through real Celery worker processes on Postgres and Redis.

  DATABASE_URL=postgres://root@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/11 \
      .venv/bin/python bench/turns.py

Its scratch database is `terret_bench_turns` next to DATABASE_URL, or
TERRET_BENCH_TURNS_DB (two checkouts measured back to back on one server).

(a) overhead per step: the model answers instantly through the local SSE
    server, one no-op tool per step, 25-step turns; median ms per step next to
    the raw append latency (psycopg: row lock, insert, commit) measured now.
(b) concurrency: 200 turns at once, model latency 1 s per call (2 calls per
    turn), on one worker host; wall time / ideal. Bursts through the same
    workers: the first meets them cold (printed, no target); then, repeated
    (--repeats-b, default 3), a burst end to end (admission included: 200
    inject calls from this process, a client's web tier, on the same cores)
    and a burst on the worker host from the wake-up (all admitted first, the
    clock starts as the 200 wake-ups are sent). The target applies to the
    worker host's median; every burst is printed.
(c) recovery, with the default lease settings (a 30 s lease, a 15 s sweep):
    of two workers, the one driving a turn is SIGKILLed mid-model-stream;
    time from the kill to the other's turn/end (the dead process's liveness
    lock is free at once: runtime/liveness.py). Then, printed without a
    target, the same with one worker: from a fresh worker's start (its
    boot included) to the resumed turn's turn/end.
Targets: (a) <= 6 raw appends per step; (b) wall <= 1.5x ideal; (c) <= 2 s.
Exits 1 when a target is not met.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._setup import ROOT, scratch_database  # noqa: E402

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
os.environ.setdefault("TERRET_QUEUE", "bench")
os.environ.setdefault("TERRET_CHANNEL_PREFIX", "bench")
os.environ["TERRET_WORKER"] = "celery"
os.environ.setdefault("TERRET_MAX_AGENTS", "10000")


def raw_append_latency(url: str, n: int = 400) -> float:
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS raw_head (id int primary key, seq bigint)")
        conn.execute("CREATE TABLE IF NOT EXISTS raw_log (id int, seq bigint, kind text, data jsonb, at timestamptz)")
        conn.execute("INSERT INTO raw_head VALUES (1, 0) ON CONFLICT DO NOTHING")
        conn.commit()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            with conn.transaction():
                seq = conn.execute("SELECT seq FROM raw_head WHERE id = 1 FOR UPDATE").fetchone()[0] + 1  # type: ignore[index]
                conn.execute("INSERT INTO raw_log VALUES (1, %s, 'tool/result', %s, now())", [seq, '{"content": "ok"}'])
                conn.execute("UPDATE raw_head SET seq = %s WHERE id = 1", [seq])
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def start_worker(name: str, concurrency: int, **env: str) -> subprocess.Popen[bytes]:
    full = dict(os.environ, **env)
    log = open(f"/tmp/terret-bench-{name}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "terret_site.worker", "--pool", "threads",
         "--concurrency", str(concurrency), "-Q", os.environ["TERRET_QUEUE"], "-n", f"{name}@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat",
         "-l", os.environ.get("BENCH_WORKER_LOG", "WARNING")],
        cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    return proc


def wait_ready(proc: subprocess.Popen[bytes], timeout: float = 60, workers: int = 1) -> None:
    from terret_site.celery import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker died: see /tmp/terret-bench-*.log (exit {proc.returncode})")
        replies = app.control.ping(timeout=0.5) or []
        if len(replies) >= workers:
            return
    raise SystemExit("worker did not become ready")


def settle(procs: list[subprocess.Popen[bytes]], quiet: float = 0.3, timeout: float = 30) -> None:
    """Wait until the workers are idle: after `ready`, a worker still warms
    up (imports, the first sweep) for a second or so, which is start-up
    cost, not per-turn cost."""
    deadline = time.monotonic() + timeout
    last = sum(cpu_seconds(p.pid) for p in procs)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = sum(cpu_seconds(p.pid) for p in procs)
        if now - last < 0.01:
            return
        last = now


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds all cores spent busy so far (Linux /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_by_command() -> dict[str, float]:
    """CPU seconds so far of every live process, summed by command name."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def top_consumers(before: dict[str, float], after: dict[str, float], n: int = 5) -> str:
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} {sec:.2f}s" for name, sec in top if sec > 0.005)


def kill(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def purge() -> None:
    from django.conf import settings

    from terret_site.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(settings.CELERY_TASK_DEFAULT_QUEUE)  # type: ignore[attr-defined]  # kombu virtual channels have it


def make_sessions(n: int, profile_name: str, tools: list[str]) -> list[Any]:
    from django.contrib.auth.models import User

    from sessions_app import services
    from sessions_app.models import AgentProfile

    user, _ = User.objects.get_or_create(username="bench")
    profile, _ = AgentProfile.objects.get_or_create(
        name=profile_name, defaults={"roles": {"main": "bench/model"}, "builtin_tools": tools, "allow_floor": ["*"]}
    )
    return [services.create_session(user, profile, agent_id=f"{profile_name}-{i}") for i in range(n)]


def wait_turn_ends(ids: list[Any], count: int = 1, timeout: float = 300, poll: float = 0.02) -> float:
    from sessions_app.models import Event

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = Event.objects.filter(session_id__in=ids, kind="turn/end").count()
        if done >= len(ids) * count:
            return time.perf_counter()
        time.sleep(poll)
    raise SystemExit(f"timed out: {done}/{len(ids) * count} turns ended")


def last_turn_end(ids: list[Any]) -> float:
    """Wall-clock time (epoch seconds) of the newest turn/end of these sessions."""
    from django.db.models import Max

    from sessions_app.models import Event

    at = Event.objects.filter(session_id__in=ids, kind="turn/end").aggregate(at=Max("created_at"))["at"]
    return float(at.timestamp())


# (a)'s tool per step: the inline no-op (the headline), or an external call
# (debug.sleep 0 s: the same work, but it is not inline, so each step also
# commits the call's message and its intent before running it).
TOOLS_A = {"noop": ("debug.noop", {}), "external": ("debug.sleep", {"seconds": 0})}


def case_a(turns: int, tool: str = "noop") -> tuple[float, float]:
    from sessions_app import services
    from sessions_app.models import Event
    from tests.fakes.fake_llm import FakeLLM, Reply

    name, arguments = TOOLS_A[tool]

    def respond(body: dict[str, Any]) -> Reply:
        tool_results = sum(1 for m in body["messages"] if m.get("role") == "tool")
        if tool_results < 24:
            return Reply(tool_calls=[(name, arguments)], usage=(10, 2, 0.0))
        return Reply(text="done", usage=(10, 2, 0.0))

    with FakeLLM(respond) as fake:
        worker = start_worker("a", 8, TERRET_LLM_BASE_URL=fake.base_url, TERRET_LLM_API_KEY="bench")
        try:
            wait_ready(worker)
            settle([worker])
            sessions = make_sessions(turns, f"bench-a-{tool}", [name])
            per_step: list[float] = []
            cpu_before = cpu_seconds(worker.pid)
            for s in sessions:
                services.inject(s.id, "go", wake=True)
                wait_turn_ends([s.id])
                stamps = list(
                    Event.objects.filter(session=s, kind__in=["step/start", "turn/end"])
                    .order_by("seq")
                    .values_list("created_at", flat=True)
                )
                steps = len(stamps) - 1
                assert steps == 25, steps
                per_step.append((stamps[-1] - stamps[0]).total_seconds() * 1000 / steps)
            cpu = (cpu_seconds(worker.pid) - cpu_before) * 1000 / (25 * len(sessions))
            print(f"    worker CPU per step (whole turns, wake-up and post-turn work included): {cpu:.2f} ms")
            last_turn = fake.requests[-25:]
            return statistics.median(per_step), bare_model_call(fake.base_url, last_turn)
        finally:
            kill(worker)


def bare_model_call(base_url: str, bodies: list[dict[str, Any]], rounds: int = 3) -> float:
    """Median ms of one model call alone: the same adapter and server, sent
    the very requests the turns' steps sent (their growing histories
    included), with nothing of the runtime around them."""
    from django.test import override_settings

    from sessions_app.llm.openai import OpenAIAdapter, from_wire
    from sessions_app.llm.types import ToolSpec

    tools = [ToolSpec("debug.noop", "no-op", {"type": "object", "properties": {}})]
    requests = []
    for body in bodies:
        messages = [dict(m) for m in body["messages"]]
        for m in messages:
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {**c, "function": {**c["function"], "name": from_wire(c["function"]["name"])}}
                    for c in m["tool_calls"]
                ]
        requests.append(messages)
    times = []
    with override_settings(TERRET_LLM_BASE_URL=base_url, TERRET_LLM_API_KEY="bench"):
        adapter = OpenAIAdapter()
        for _ in range(rounds):
            for messages in requests:
                t0 = time.perf_counter()
                adapter.complete("bench/model", messages, tools, on_delta=lambda _t: None)
                times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


COLD = "cold workers, end to end"
WARM = [("end to end, admission included", False), ("worker host, from wake-up", True)]


def bursts(repeats: int) -> list[tuple[str, bool]]:
    """(label, admit_first) per burst. The first meets fresh workers: each
    pool thread starts, builds its HTTP client and its pool connections
    prepare their statements on first use. The target applies to the warm
    ones, which alternate so that both kinds meet the same conditions."""
    return [(COLD, False), *WARM * repeats]


def case_b(turns: int, workers: int, concurrency: int, latency: float, repeats: int) -> list[tuple[str, float, float]]:
    """Bursts of `turns` turns through the same worker processes; returns
    (label, wall, ideal) per burst. End to end: the clock starts before the
    admissions (done by this process in 8 threads, on the same cores as the
    workers). Worker host: all turns are admitted first with no wake-up
    sent; the clock starts when the wake-ups are sent."""
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.fake_llm", "--port", "0", "--latency", str(latency),
         "--mode", "tool-then-final", "--tool", "debug.noop"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert fake.stdout is not None
    base_url = fake.stdout.readline().strip().split()[-1]
    procs = [
        start_worker(f"b{i}", concurrency, TERRET_LLM_BASE_URL=base_url, TERRET_LLM_API_KEY="bench")
        for i in range(workers)
    ]
    results = []
    try:
        for p in procs:
            wait_ready(p)
        settle(procs)
        for n, (label, admit_first) in enumerate(bursts(repeats)):
            print(f"    -- {label}")
            wall = _burst(procs, fake, make_sessions(turns, f"bench-b{n}", ["debug.noop"]), admit_first)
            results.append((label, wall, 2 * latency))
            settle(procs)
        return results
    finally:
        for p in procs:
            kill(p)
        fake.terminate()


def _burst(
    procs: list[subprocess.Popen[bytes]], fake: subprocess.Popen[str], sessions: list[Any], admit_first: bool
) -> float:
    from django.test import override_settings

    from sessions_app import services
    from sessions_app.tasks import drive_session

    ids = [s.id for s in sessions]
    if admit_first:
        with override_settings(TERRET_WORKER="manual"):
            for i in ids:
                services.inject(i, "go", wake=True)
    cpu_before = sum(cpu_seconds(p.pid) for p in procs)
    fake_before, bench_before = cpu_seconds(fake.pid), cpu_seconds(os.getpid())
    busy_before = machine_busy()
    by_command = cpu_by_command()
    t0 = time.perf_counter()
    t0_epoch = time.time()
    if admit_first:
        from terret_site.celery import app

        # One producer and one pipelined batch for the lot: this process
        # stands in for the web processes of other hosts and should take
        # little of this host's CPU.
        with app.producer_or_acquire() as producer, producer.batch():
            for i in ids:
                drive_session.apply_async((str(i),), producer=producer)
    else:
        threads = [threading.Thread(target=_admit, args=(ids[k::8],)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    t_admitted = time.perf_counter()
    # Wall time from the log's own stamps: the last turn/end's commit time.
    # Polling then needs no precision, so it polls rarely and stays off the CPU.
    wait_turn_ends(ids, poll=0.25)
    wall = last_turn_end(ids) - t0_epoch
    worker_cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu_before
    busy = machine_busy() - busy_before
    print(f"    worker CPU {worker_cpu:.2f}s = {worker_cpu * 1000 / len(ids):.1f} ms per turn")
    fake_cpu, bench_cpu = cpu_seconds(fake.pid) - fake_before, cpu_seconds(os.getpid()) - bench_before
    print(f"    model server CPU {fake_cpu:.2f}s, this process (admission, polling) {bench_cpu:.2f}s")
    print(f"    machine busy {busy:.2f} CPU-s of {wall * (os.cpu_count() or 1):.2f} ({os.cpu_count()} cores)")
    print(f"    CPU by command: {top_consumers(by_command, cpu_by_command())}")
    _timeline(ids, 0.0 if admit_first else t_admitted - t0)
    return wall


def _admit(ids: list[Any]) -> None:
    """What a client's web process does per turn: inject with a wake-up."""
    from django.db import connection

    from sessions_app import services

    try:
        for i in ids:
            services.inject(i, "go", wake=True)
    finally:
        connection.close()  # back to this process's pool: the thread ends here


def _timeline(ids: list[Any], admit: float) -> None:
    """Where the wall time of case (b) went, from the log's own timestamps."""
    from django.db.models import Max, Min

    from sessions_app.models import Event

    def span(kind: str, **extra: Any) -> tuple[Any, Any]:
        agg = Event.objects.filter(session_id__in=ids, kind=kind, **extra).aggregate(
            a=Min("created_at"), b=Max("created_at")
        )
        return agg["a"], agg["b"]

    t0, _ = span("turn/start")
    for label, kind, extra in [
        ("turn/start", "turn/start", {}),
        ("step 1 start", "step/start", {"data__step": 1}),
        ("step 2 start", "step/start", {"data__step": 2}),
        ("turn/end", "turn/end", {}),
    ]:
        a, b = span(kind, **extra)
        print(f"    {label:>13}: first +{(a - t0).total_seconds():.2f}s  last +{(b - t0).total_seconds():.2f}s")
    print(f"    admission of all turns took {admit:.2f}s")
    starts = dict(Event.objects.filter(session_id__in=ids, kind="turn/start").values_list("session_id", "created_at"))
    firsts = dict(
        Event.objects.filter(session_id__in=ids, kind="step/start", data__step=1).values_list(
            "session_id", "created_at"
        )
    )
    lags = sorted((firsts[i] - starts[i]).total_seconds() for i in ids)
    print(f"    admission -> step 1: min {lags[0]:.2f}s  median {lags[len(lags) // 2]:.2f}s  max {lags[-1]:.2f}s")


# Empty values: the production defaults, whatever this shell exports (terret_site/env.py).
DEFAULT_LEASES = {"TERRET_LEASE_SECONDS": "", "TERRET_SWEEP_SECONDS": "", "TERRET_LIVENESS_POLL_SECONDS": ""}


def case_c() -> tuple[float, float]:
    """(kill -9 of the driving worker -> turn/end by the other of two,
    a fresh worker's start -> turn/end after the only worker's kill -9),
    seconds, both with the default lease settings."""
    from tests.fakes.fake_llm import FakeLLM, Reply

    with FakeLLM() as fake:
        env = {"TERRET_LLM_BASE_URL": fake.base_url, "TERRET_LLM_API_KEY": "bench", **DEFAULT_LEASES}
        fake.script(Reply(text="never ends", hang=True), Reply(text="recovered"))
        procs = [start_worker("c1", 8, **env), start_worker("c2", 8, **env)]
        try:
            for p in procs:
                wait_ready(p, workers=2)
            settle(procs)
            session = _turn_in_flight(fake, "bench-c")
            driver = _holder(session.id, procs)
            killed_at = time.time()
            kill(driver)
            wait_turn_ends([session.id], timeout=60)
            _one_turn(session)
            takeover = last_turn_end([session.id]) - killed_at
        finally:
            for p in procs:
                kill(p)
        purge()
        fake.script(Reply(text="never ends", hang=True), Reply(text="recovered"))
        first = start_worker("c3", 8, **env)
        try:
            wait_ready(first)
            settle([first])
            session = _turn_in_flight(fake, "bench-c-fresh")
        finally:
            kill(first)
        started_at = time.time()
        second = start_worker("c4", 8, **env)
        try:
            wait_turn_ends([session.id], timeout=60)
            _one_turn(session)
            fresh = last_turn_end([session.id]) - started_at
        finally:
            kill(second)
    return takeover, fresh


def _turn_in_flight(fake: Any, profile_name: str) -> Any:
    """A session whose turn's model call is under way (the reply hangs)."""
    from sessions_app import services

    (session,) = make_sessions(1, profile_name, ["debug.noop"])
    asked = len(fake.requests)
    services.inject(session.id, "go", wake=True)
    while len(fake.requests) <= asked:
        time.sleep(0.01)
    time.sleep(0.2)  # mid-stream
    return session


def _holder(session_id: Any, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """The worker process holding the session's lease (its owner is host:pid:thread:nonce)."""
    from sessions_app.models import Session

    owner = Session.objects.values_list("lease_owner", flat=True).get(id=session_id)
    pid = int(owner.split(":")[1])
    return next(p for p in procs if p.pid == pid)


def _one_turn(session: Any) -> None:
    from sessions_app.models import Event

    assert Event.objects.filter(session=session, kind="turn/start").count() == 1


TARGET_A = 6.0  # runtime overhead per step, in raw appends
TARGET_B = 1.5  # wall / ideal on the worker host, median of the warm bursts
TARGET_C = 2.0  # seconds from the kill -9 of a turn's worker to its turn/end by another
WORKER_HOST = WARM[1][0]


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns-a", type=int, default=5)
    parser.add_argument("--turns-b", type=int, default=200)
    parser.add_argument("--workers-b", type=int, default=2)
    parser.add_argument("--concurrency-b", type=int, default=128)
    parser.add_argument("--latency-b", type=float, default=1.0)
    parser.add_argument("--repeats-b", type=int, default=3)
    parser.add_argument("--only", choices=["a", "b", "c"])
    parser.add_argument("--tool-a", choices=sorted(TOOLS_A), default="noop", help="(a)'s tool per step")
    args = parser.parse_args()
    url = scratch_database(os.environ.get("TERRET_BENCH_TURNS_DB", "terret_bench_turns"))
    purge()
    ok = True
    if args.only in (None, "a"):
        raw = raw_append_latency(url)
        median, model = case_a(args.turns_a, args.tool_a)
        overhead = median - model
        print(f"(a) raw append (lock+insert+commit): {raw:.2f} ms")
        tool = "no-op tool" if args.tool_a == "noop" else "external tool: debug.sleep 0 s"
        print(f"(a) step, 25-step turns through a worker (instant model, {tool}): median {median:.2f} ms")
        print(f"(a) the model call alone (same adapter, server and requests, no runtime): median {model:.2f} ms")
        print(f"(a) runtime overhead per step (step - model call): {overhead:.2f} ms")
        met = overhead / raw <= TARGET_A
        print(
            f"(a) overhead / raw append: {overhead / raw:.2f} (target <= {TARGET_A:g}: {verdict(met)}); "
            f"step / raw append: {median / raw:.2f}"
        )
        ok &= met
    if args.only in (None, "b"):
        purge()
        results = case_b(args.turns_b, args.workers_b, args.concurrency_b, args.latency_b, args.repeats_b)
        print(
            f"(b) {args.turns_b} turns at once, {args.workers_b} worker processes x {args.concurrency_b} threads, "
            f"model latency {args.latency_b}s x 2 calls, ideal {2 * args.latency_b:.2f}s"
        )
        for label in [COLD] + [w for w, _ in WARM]:
            ratios = [wall / ideal for lab, wall, ideal in results if lab == label]
            walls = ", ".join(f"{wall:.2f}s" for lab, wall, _ in results if lab == label)
            line = f"(b) wall / ideal ({label}): median {statistics.median(ratios):.2f} of {_list(ratios)} ({walls})"
            if label != WORKER_HOST:
                # Cold workers, and the end-to-end run whose admissions (a
                # client's web tier) share the cores: printed, no target.
                print(line)
                continue
            met = statistics.median(ratios) <= TARGET_B
            print(f"{line} (target <= {TARGET_B:g}: {verdict(met)})")
            ok &= met
    if args.only in (None, "c"):
        purge()
        recovery, fresh = case_c()
        met = recovery <= TARGET_C
        print(
            f"(c) recovery (default settings): {recovery:.2f} s, kill -9 of the driving worker -> turn/end "
            f"by the other of two (target <= {TARGET_C:g}: {verdict(met)})"
        )
        print(
            f"(c) one worker (default settings): a fresh worker's start -> turn/end {fresh:.2f} s (its boot included)"
        )
        ok &= met
    print(f"targets: {verdict(ok)}")
    return 0 if ok else 1


def _list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


if __name__ == "__main__":
    sys.exit(main())
