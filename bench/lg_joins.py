"""/lg/ joins and a neighbour's API (issue 28, M5): another user's API p50
alone, and while one user holds 24 /lg/ joins open on running runs.

  DATABASE_URL=postgres://root@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/12 \\
      .venv/bin/python bench/lg_joins.py

Creates (and drops first) its own scratch database `terret_bench_lgjoins`,
starts `daphne terret_site.asgi:application` (TERRET_WORKER=manual: the runs
stay running, so the joins wait for the whole measurement). The joining user
has 24 threads of --events events each (~500 B of text per message), each
with an open run; the neighbour has one session of its own.

Measured: --requests sequential `GET /api/sessions/{id}` by the neighbour
(Bearer token), alone, then with the 24 joins waiting (after --settle
seconds). Target: p50 with joins <= 1.5 x p50 alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._setup import ROOT, scratch_database  # noqa: E402

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
os.environ.setdefault("TERRET_CHANNEL_PREFIX", "benchlgj")
os.environ.setdefault("TERRET_QUEUE", "benchlgj")
os.environ.setdefault("SECRET_KEY", "bench-only-" + uuid.uuid4().hex)
os.environ.setdefault("LOG_LEVEL", "WARNING")

RATIO_TARGET = 1.5
JOINS = 24


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daphne() -> tuple[subprocess.Popen[bytes], int, str]:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="terret-bench-lgj-", suffix=".log", delete=False)
    env = {**os.environ, "TERRET_WORKER": "manual"}
    cmd = [str(ROOT / ".venv" / "bin" / "daphne"), "-b", "127.0.0.1", "-p", str(port), "terret_site.asgi:application"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"daphne exited ({proc.returncode}); see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/openapi.json", timeout=2):
                return proc, port, log.name
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"daphne did not start; see {log.name}")


def build(events: int) -> tuple[str, uuid.UUID, str, list[tuple[uuid.UUID, str]]]:
    """The neighbour (token, session) and the joiner (token, 24 running runs)."""
    from django.contrib.auth import get_user_model

    from sessions_app import log
    from sessions_app.lg import mapping
    from sessions_app.models import AgentProfile
    from sessions_app.services import sessions
    from sessions_app.services.tokens import issue_token

    profile = AgentProfile.objects.create(name="bench", roles={"main": "test/model"})
    users = get_user_model().objects
    neighbour, joiner = users.create_user("neighbour"), users.create_user("joiner")
    _, neighbour_token = issue_token(neighbour, "bench")
    _, joiner_token = issue_token(joiner, "bench")
    mine = sessions.create_session(neighbour, profile)
    text = "lorem ipsum " * 40
    runs = []
    for _ in range(JOINS):
        thread = sessions.create_session(joiner, profile)
        for _ in range(events // 4):
            log.append_many(
                thread.id,
                [
                    ("turn/start", {"by": "bench"}),
                    ("user/message", {"text": text}),
                    ("assistant/message", {"content": text}),
                    ("turn/end", {"status": "completed"}),
                ],
            )
        opened = log.append(thread.id, "turn/start", {"by": "bench"})
        log.append(thread.id, "user/message", {"text": "still running"})
        runs.append((thread.id, mapping.run_id(thread.id, opened.seq)))
    return neighbour_token, mine.id, joiner_token, runs


async def p50(base: str, token: str, session_id: uuid.UUID, n: int) -> tuple[float, float]:
    import httpx

    samples = []
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        for _ in range(5):
            (await http.get(f"/api/sessions/{session_id}")).raise_for_status()
        for _ in range(n):
            at = time.perf_counter()
            (await http.get(f"/api/sessions/{session_id}")).raise_for_status()
            samples.append((time.perf_counter() - at) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.9)]


async def measure(args: argparse.Namespace, base: str, world: Any) -> dict[str, float]:
    import httpx

    neighbour_token, mine, joiner_token, runs = world
    alone = await p50(base, neighbour_token, mine, args.requests)
    limits = httpx.Limits(max_connections=JOINS + 4)
    async with httpx.AsyncClient(base_url=f"{base}/lg", headers={"x-api-key": joiner_token}, limits=limits) as http:
        joins = [
            asyncio.create_task(http.get(f"/threads/{t}/runs/{r}/join", timeout=httpx.Timeout(600))) for t, r in runs
        ]
        await asyncio.sleep(args.settle)
        done = [j for j in joins if j.done()]
        if done:
            sys.exit(f"{len(done)} joins ended early: {done[0].result().text[:300]}")
        loaded = await p50(base, neighbour_token, mine, args.requests)
        for j in joins:
            j.cancel()
        await asyncio.gather(*joins, return_exceptions=True)
    return {"alone_p50": alone[0], "alone_p90": alone[1], "joins_p50": loaded[0], "joins_p90": loaded[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default="terret_bench_lgjoins")
    parser.add_argument("--events", type=int, default=2000, help="events in each joined thread")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--settle", type=float, default=3.0)
    args = parser.parse_args()
    scratch_database(args.db)
    world = build(args.events)
    proc, port, logname = start_daphne()
    try:
        figures = asyncio.run(measure(args, f"http://127.0.0.1:{port}", world))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    ratio = figures["joins_p50"] / figures["alone_p50"]
    print(f"/lg/ joins: {JOINS} joins on threads of {args.events} events; neighbour's GET /api/sessions/{{id}}")
    print(f"  alone       p50 {figures['alone_p50']:7.2f} ms   p90 {figures['alone_p90']:7.2f} ms")
    print(f"  with joins  p50 {figures['joins_p50']:7.2f} ms   p90 {figures['joins_p90']:7.2f} ms")
    verdict = "ok" if ratio <= RATIO_TARGET else "OVER TARGET"
    print(f"  ratio {ratio:.2f} (target <= {RATIO_TARGET}): {verdict}  (daphne log: {logname})")


if __name__ == "__main__":
    main()
