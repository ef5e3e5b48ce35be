"""One profile at full speed: steps/s of N sessions with sharded tallies against one tally row.

    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python bench/hot_profile.py [--writers 8]

Creates (and afterwards drops) a scratch database `terret_bench_hot`. N
writer processes (multiprocessing "spawn", so no two share a GIL), each with
its own session of ONE profile, append step/end events with a priced usage
as fast as they can: each append is the step's commit with its tally
upserts (UsageDay, ModelTally) in the same statement. Two modes, in the same
run, in rotating slices so a stall of the shared server lands on both:

  sharded   TERRET_TALLY_SHARDS=16 (the default): each session adds to its own row
  one-row   TERRET_TALLY_SHARDS=1: every step of the profile updates the same
            row, and waits for its lock until the previous step commits

The last line is `sharded/one-row steps/s ratio: X`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DB = "terret_bench_hot"
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.001}


def _writer(url: str, shards: int, session_id: str, start_at: float, seconds: float) -> int:
    os.environ.update(
        {
            "DATABASE_URL": url,
            "TERRET_TALLY_SHARDS": str(shards),
            "SECRET_KEY": "bench-only",
            "DJANGO_SETTINGS_MODULE": "terret_site.settings",
            "TERRET_WORKER": "manual",
        }
    )
    import django

    django.setup()
    from sessions_app import log

    log.append(session_id, "step/end", {"step": 1, "model": "bench/model", "usage": USAGE})  # warm: connect, prepare
    time.sleep(max(0.0, start_at - time.time()))
    n, end = 0, start_at + seconds
    while time.time() < end:
        log.append(session_id, "step/end", {"step": 1, "model": "bench/model", "usage": USAGE})
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--slice", type=float, default=3.0, help="seconds per slice")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from bench._setup import create_database, scratch_database

    url = scratch_database(DB)
    from django.contrib.auth import get_user_model

    from sessions_app import services
    from sessions_app.log.runs import tally_shard
    from sessions_app.models import AgentProfile, UsageDay

    os.environ["TERRET_WORKER"] = "manual"
    owner = get_user_model().objects.create_user("bench")
    profile = AgentProfile.objects.create(name="hot", roles={"main": "bench/model"}, daily_tokens=None)
    sessions: list[str] = []
    seen: set[int] = set()
    while len(sessions) < args.writers:  # sessions on distinct shards, as a real spread would mostly give
        sid = services.create_session(owner, profile).id
        if tally_shard(sid) % 16 not in seen or len(seen) >= 16:
            seen.add(tally_shard(sid) % 16)
            sessions.append(str(sid))

    totals = {"sharded": [0, 0.0], "one-row": [0, 0.0]}
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.writers) as pool:
        # A warm-up slice, not counted: the pool's processes start, import
        # Django and prepare their statements (the first slice ran 10x slower).
        warm = time.time() + 6.0
        for job in [pool.apply_async(_writer, (url, 16, sid, warm, 1.0)) for sid in sessions]:
            job.get()
        for r in range(args.rounds):
            order = [("sharded", 16), ("one-row", 1)]
            for mode, shards in order if r % 2 == 0 else order[::-1]:
                start_at = time.time() + 4.0  # every writer set up and warm before the clock starts
                jobs: list[Any] = [
                    pool.apply_async(_writer, (url, shards, sid, start_at, args.slice)) for sid in sessions
                ]
                steps = sum(job.get() for job in jobs)
                totals[mode][0] += steps
                totals[mode][1] += args.slice
                print(f"round {r + 1} {mode:8} {steps / args.slice:8.0f} steps/s", flush=True)
    rows = UsageDay.objects.filter(profile=profile).count()
    rate = {mode: steps / seconds for mode, (steps, seconds) in totals.items()}
    print(f"writers={args.writers} sessions of one profile, UsageDay rows of the profile today: {rows}")
    print(f"sharded {rate['sharded']:.0f} steps/s, one-row {rate['one-row']:.0f} steps/s")
    print(f"sharded/one-row steps/s ratio: {rate['sharded'] / rate['one-row']:.2f}")
    from django.db import connections

    connections.close_all()
    create_database(DB)  # drop what we made: leave an empty database behind, as bench/append.py does


if __name__ == "__main__":
    main()
