"""Live log benchmark: append-to-client latency through a real daphne process
and the Redis channel layer, and the time to replay 10k events on connect.

  DATABASE_URL=postgres://root@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/12 \\
      .venv/bin/python bench/live.py

Creates (and drops first) its own scratch database `terret_bench_live` next to
DATABASE_URL, starts `daphne terret_site.asgi:application` on a free port, and
connects with the `websockets` client library as a signed-in user (session
cookie, allowed Origin), exactly as the chat page does.

(a) one session, 50 watching sockets: events appended with
    sessions_app.log.append in this process; latency = time from just before
    append() to the frame's arrival at each socket (all 50 samples count).
(b) 50 sessions, one socket each, appends round-robin across them.
(c) replay: a socket connects with ?after=0 to a session of 10,000 events;
    time from opening the connection to holding the 10,000th event frame.
Targets: p99 <= 50 ms on loopback for (a) and (b); (c) <= 1 s.
Runtime is bounded: every wait has a timeout; the whole run takes ~1 minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._setup import ROOT, scratch_database  # noqa: E402

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
os.environ.setdefault("TERRET_CHANNEL_PREFIX", "benchlive")
os.environ.setdefault("TERRET_QUEUE", "benchlive")
os.environ.setdefault("SECRET_KEY", "bench-only-" + uuid.uuid4().hex)
os.environ.setdefault("LOG_LEVEL", "WARNING")

P99_TARGET_MS = 50.0
REPLAY_TARGET_S = 1.0
TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


class Daphne:
    def __init__(self, app: str) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="terret-bench-daphne-", suffix=".log", delete=False)
        cmd = [str(ROOT / ".venv" / "bin" / "daphne"), "-b", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, app], cwd=ROOT, env=dict(os.environ),
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"daphne exited ({self.proc.returncode}); see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/accounts/login/", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        sys.exit(f"daphne did not start; see {self.log.name}")

    def cpu_seconds(self) -> float:
        """User + system CPU time the server has used so far (Linux /proc)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Watcher:
    """One socket; records when each event frame arrived."""

    def __init__(self, url: str, cookie: str, origin: str) -> None:
        self.url, self.cookie, self.origin = url, cookie, origin
        self.arrived: dict[int, float] = {}
        self.synced = asyncio.Event()
        self.until: int | None = None  # set `reached` when this seq arrives
        self.reached = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.ws: Any = None

    async def start(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(
            self.url, additional_headers={"Cookie": f"sessionid={self.cookie}"}, origin=self.origin,  # type: ignore[arg-type]
            max_size=None, open_timeout=TIMEOUT,
        )  # fmt: skip
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            now = time.perf_counter()
            if raw.startswith('{"type":"event"'):
                # The seq is right after the type: avoid parsing whole frames
                # so the clock reads what the network delivered, not our json.
                seq = int(raw[22 : raw.index(",", 22)])
                self.arrived[seq] = now
                if seq == self.until:
                    self.reached.set()
            else:
                frame = json.loads(raw)
                if frame["type"] == "event":
                    self.arrived[frame["seq"]] = now
                elif frame["type"] == "synced":
                    self.synced.set()
                elif frame["type"] == "error":
                    print("  server error frame:", frame, file=sys.stderr)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.task is not None:
            self.task.cancel()


async def watch(base: str, cookie: str, session_ids: list[uuid.UUID], per_session: int, after: int) -> list[Watcher]:
    origin = base.replace("ws://", "http://")
    watchers = [
        Watcher(f"{base}/ws/sessions/{sid}/?after={after}", cookie, origin)
        for sid in session_ids
        for _ in range(per_session)
    ]
    await asyncio.gather(*(w.start() for w in watchers))
    await asyncio.wait_for(asyncio.gather(*(w.synced.wait() for w in watchers)), TIMEOUT)
    return watchers


def append_paced(targets: list[uuid.UUID], n: int, interval: float) -> list[tuple[uuid.UUID, int, float]]:
    """n appends, round-robin over `targets`, one every `interval` seconds.

    Runs in its own process (see appender_process): the 50 sockets' frame
    handling in this one must not delay the appends or their timestamps.
    perf_counter is CLOCK_MONOTONIC, one clock for every process on the host.
    """
    import django

    django.setup()
    from django.db import connection

    from sessions_app import log

    sent: list[tuple[uuid.UUID, int, float]] = []
    next_at = time.perf_counter()
    for i in range(n):
        sid = targets[i % len(targets)]
        t0 = time.perf_counter()
        event = log.append(sid, "model/updated", {"role": "main", "spec": f"bench/{i}"})
        sent.append((sid, event.seq, t0))
        next_at += interval
        time.sleep(max(0.0, next_at - time.perf_counter()))
    connection.close()
    return sent


def appender_process(targets: list[uuid.UUID], n: int, interval: float) -> list[tuple[uuid.UUID, int, float]]:
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or connections inherited
    with ctx.Pool(1) as pool:
        return pool.apply(append_paced, (targets, n, interval))


async def latency_run(
    label: str, server: Daphne, cookie: str, sessions: list[uuid.UUID], per_session: int, n: int, interval: float
) -> dict[str, Any]:
    base = f"ws://127.0.0.1:{server.port}"
    watchers = await watch(base, cookie, sessions, per_session, after=0)  # fresh, empty sessions
    cpu0 = server.cpu_seconds()
    by_session: dict[uuid.UUID, list[Watcher]] = {}
    for w, sid in zip(watchers, [s for s in sessions for _ in range(per_session)], strict=True):
        by_session.setdefault(sid, []).append(w)
    warm = min(n // 10, 20)
    sent = await asyncio.to_thread(appender_process, sessions, n + warm, interval)
    last = {sid: max(seq for s, seq, _ in sent if s == sid) for sid in sessions}
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if all(last[sid] in w.arrived for sid, ws in by_session.items() for w in ws):
            break
        await asyncio.sleep(0.05)
    cpu = server.cpu_seconds() - cpu0
    samples: list[float] = []
    spreads: list[float] = []  # first to last socket, per event: fan-out cost
    missing = 0
    for sid, seq, t0 in sent[warm:]:
        got = [w.arrived[seq] for w in by_session[sid] if seq in w.arrived]
        missing += len(by_session[sid]) - len(got)
        samples.extend((t - t0) * 1000 for t in got)
        if got:
            spreads.append((max(got) - min(got)) * 1000)
    await asyncio.gather(*(w.close() for w in watchers))
    return {
        "label": label,
        "sockets": len(watchers),
        "events": n,
        "samples": len(samples),
        "missing": missing,
        "p50": statistics.median(samples) if samples else float("nan"),
        "p99": pct(samples, 99) if samples else float("nan"),
        "max": max(samples) if samples else float("nan"),
        "spread": statistics.median(spreads) if spreads else float("nan"),
        "cpu_ms": cpu * 1000 / len(sent),
    }


def fill(session_id: uuid.UUID, count: int) -> None:
    """`count` events through the log, 1000 per transaction."""
    from django.db import connection

    from sessions_app import log

    content = "x" * 200
    done = 0
    while done < count:
        with log.locked(session_id) as tx:
            for _ in range(min(1000, count - done)):
                done += 1
                tx.append(
                    "tool/result", {"call_id": f"c{done}", "name": "clock.now", "content": content, "is_error": False}
                )
    connection.close()


async def replay_run(base: str, cookie: str, session_id: uuid.UUID, count: int, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        w = Watcher(f"{base}/ws/sessions/{session_id}/?after=0", cookie, base.replace("ws://", "http://"))
        w.until = count
        t0 = time.perf_counter()
        await w.start()
        try:
            await asyncio.wait_for(w.reached.wait(), TIMEOUT)
        except TimeoutError:
            times.append(float("inf"))
        else:
            assert len(w.arrived) == count, f"replay delivered {len(w.arrived)} of {count} events"
            times.append(w.arrived[count] - t0)
        await w.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default="terret_bench_live", help="scratch database name (dropped and recreated)")
    parser.add_argument("--clients", type=int, default=50, help="sockets on one session, and sessions in run (b)")
    parser.add_argument("--events", type=int, default=200, help="appends measured per latency run")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between appends (default 20/s)")
    parser.add_argument("--asgi", default="terret_site.asgi:application", help="ASGI app daphne serves")
    parser.add_argument("--replay", type=int, default=10_000, help="events in the replayed session")
    args = parser.parse_args()

    print(f"scratch database {args.db}: creating and migrating …", flush=True)
    scratch_database(args.db)
    from django.contrib.auth import get_user_model
    from django.test import Client

    from sessions_app.models import Session

    user = get_user_model().objects.create_user("bench", password="bench-pw-123")
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    one = Session.objects.create(owner=user)
    many = [Session.objects.create(owner=user).id for _ in range(args.clients)]
    big = Session.objects.create(owner=user)
    print(f"filling a session with {args.replay} events …", flush=True)
    t = time.perf_counter()
    fill(big.id, args.replay)
    print(f"  {args.replay} appends in {time.perf_counter() - t:.1f} s", flush=True)

    server = Daphne(args.asgi)
    print(f"daphne on port {server.port} (log {server.log.name})", flush=True)
    try:
        results = asyncio.run(run_all(args, server, cookie, one.id, many, big.id))
    finally:
        server.stop()
    report(args, *results)


async def run_all(
    args: argparse.Namespace, server: Daphne, cookie: str, one: uuid.UUID, many: list[uuid.UUID], big: uuid.UUID
) -> tuple[dict[str, Any], dict[str, Any], list[float]]:
    n, gap = args.events, args.interval
    a = await latency_run(f"(a) 1 session x {args.clients} sockets", server, cookie, [one], args.clients, n, gap)
    b = await latency_run(f"(b) {args.clients} sessions x 1 socket", server, cookie, many, 1, n, gap)
    c = await replay_run(f"ws://127.0.0.1:{server.port}", cookie, big, args.replay, rounds=3)
    return a, b, c


def report(args: argparse.Namespace, a: dict[str, Any], b: dict[str, Any], replay: list[float]) -> None:
    ok = True
    print("\nappend -> client latency (ms), Redis channel layer, loopback")
    print(f"  appends: {1 / args.interval:.0f}/s; spread = median first-to-last socket gap per event;")
    print(f"  server cpu = daphne CPU ms per appended event; host load average now {os.getloadavg()[0]:.1f}")
    head = f"  {'run':32} {'sockets':>7} {'events':>6} {'samples':>7} {'missing':>7} {'p50':>7} {'p99':>7} {'max':>7}"
    print(head + f" {'spread':>7} {'server cpu':>10}  target")
    for r in (a, b):
        met = r["p99"] <= P99_TARGET_MS and r["missing"] == 0
        print(
            f"  {r['label']:32} {r['sockets']:>7} {r['events']:>6} {r['samples']:>7} {r['missing']:>7}"
            f" {r['p50']:>7.1f} {r['p99']:>7.1f} {r['max']:>7.1f} {r['spread']:>7.1f} {r['cpu_ms']:>10.1f}"
            f"  {'met' if met else 'NOT MET'}"
        )
        ok &= met
    med = statistics.median(replay)
    print(
        f"\nreplay of {args.replay} events on connect (s): "
        + ", ".join(f"{t:.3f}" for t in replay)
        + f"  median {med:.3f}"
    )
    print(f"  target {REPLAY_TARGET_S:.0f} s: {'met' if med <= REPLAY_TARGET_S else 'NOT MET'}")
    ok &= med <= REPLAY_TARGET_S
    print(
        f"\nall targets (p99 <= {P99_TARGET_MS:.0f} ms, replay <= {REPLAY_TARGET_S:.0f} s):",
        "met" if ok else "NOT MET",
    )


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
