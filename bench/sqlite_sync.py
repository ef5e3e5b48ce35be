"""The cost of embedded SQLite's synchronous=FULL (docs/storage.md).

    .venv/bin/python bench/sqlite_sync.py [--events 400] [--rounds 3]

Durable appends per second through sessions_app.log.append() on the
embedded path, FULL (the default: each commit is on the disk before it is
acknowledged) against NORMAL (TERRET_SQLITE_SYNCHRONOUS=NORMAL, in WAL mode:
the last commits may be lost on power loss), in the same run: each round
runs both modes, in alternating order, each in its own process on its own
freshly migrated database file in a temporary directory under var/ (where the
embedded database lives; TERRET_BENCH_DIR to choose another disk), so a disk stall
lands on both alike. One writer, one transaction per event.

The last line is `FULL/NORMAL append time ratio: X` (how many times longer a
durable append takes under FULL; informative, no target: the price depends
on the disk's flush latency, the whole point of the setting).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import django
django.setup()
from django.contrib.auth import get_user_model
from django.db import connection
from sessions_app import log
from sessions_app.models import Session
n = int(sys.argv[1])
owner = get_user_model().objects.create(username="bench")
sid = Session.objects.create(owner=owner).id
with connection.cursor() as cur:
    cur.execute("PRAGMA synchronous")
    level = cur.fetchone()[0]
payload = {"call_id": "call_bench", "name": "bench.noop", "content": "ok"}
for _ in range(20):
    log.append(sid, "tool/result", payload)  # warm-up: statement caches, the file's first pages
started = time.perf_counter()
for _ in range(n):
    log.append(sid, "tool/result", payload)
elapsed = time.perf_counter() - started
print(json.dumps({"level": level, "per_append_ms": elapsed * 1000 / n}))
"""


def env_for(db: Path, mode: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": f"sqlite:///{db}",
            "REDIS_URL": "",
            "TERRET_WORKER": "manual",
            "TERRET_SQLITE_SYNCHRONOUS": mode,
            "SECRET_KEY": env.get("SECRET_KEY") or "bench-only",
            "DJANGO_SETTINGS_MODULE": "terret_site.settings",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.pop("TERRET_TESTING", None)
    return env


def one(tmp: Path, mode: str, events: int, i: int) -> float:
    db = tmp / f"{mode.lower()}-{i}.sqlite3"
    env = env_for(db, mode)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(events)], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["level"] == {"FULL": 2, "NORMAL": 1}[mode], got
    return float(got["per_append_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"FULL": [], "NORMAL": []}
    under = os.environ.get("TERRET_BENCH_DIR") or ROOT / "var"
    with tempfile.TemporaryDirectory(prefix="terret-bench-sqlite-", dir=under) as raw:
        tmp = Path(raw)
        print(f"embedded SQLite under {tmp}, {args.events} appends per mode per round, {args.rounds} rounds")
        for i in range(args.rounds):
            order = ("FULL", "NORMAL") if i % 2 == 0 else ("NORMAL", "FULL")
            for mode in order:
                ms = one(tmp, mode, args.events, i)
                times[mode].append(ms)
                print(f"round {i + 1} {mode:<6} {ms:.3f} ms per durable append ({1000 / ms:.0f}/s)")
    full, normal = statistics.median(times["FULL"]), statistics.median(times["NORMAL"])
    print(f"median: FULL {full:.3f} ms, NORMAL {normal:.3f} ms per append")
    print(f"FULL/NORMAL append time ratio: {full / normal:.2f}")


if __name__ == "__main__":
    main()
