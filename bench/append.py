"""Durable append throughput: the project's append() against raw psycopg.

    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python bench/append.py

Creates (and afterwards drops) a scratch database `terret_bench` on the same
server, migrates it, and measures on the same tables, in the same run:

  raw     psycopg 3 on its own connection, one transaction per event:
          BEGIN; UPDATE session row (row lock + next seq) RETURNING;
          INSERT event; COMMIT.  This is the target's baseline.
  raw1    the single UPDATE-then-INSERT statement append() itself sends, in
          autocommit: the floor for the same durable work, printed so the
          framework's own overhead is visible too.
  append  sessions_app.log.append() through Django: payload validation,
          projection update, fan-out hand-off and channel-layer hint.

Cases: one session (one writer); 8 sessions in parallel (8 writers, one
session each); 8 writers on one session. Writers are separate OS processes
(multiprocessing "spawn"), started once and reused, so no two writers share
a GIL and Django start-up is not timed.

Commit latency on a shared server swings by an order of magnitude within
seconds (another database's CREATE DATABASE forces a checkpoint, say), so
the modes are not measured one after another: each case runs --slices short
slices (--slice seconds) per mode, in rotating order, and a rate is events
over time summed across that mode's slices. A stall then lands on all three
modes alike instead of deciding the ratio. Durable means what the server is
configured to do on COMMIT; the header prints synchronous_commit and fsync,
and both sides pay the same.

Then derive_messages is timed on sessions of 100, 10k and 100k events with a
compaction 40 events before the end: reads start at the compaction, so the
time must not grow with the log (target: 100k/100 <= 1.5).

The last line is `append/raw ratio (1 session): X` (target >= 0.7 on every row).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KIND = "tool/result"
PAYLOAD = {"call_id": "call_bench", "name": "bench.noop", "content": "ok"}
WRITERS = 8
TARGET_RATIO = 0.7
TARGET_DERIVE = 1.5

RAW_SQL = (
    "UPDATE sessions_app_session SET last_seq = last_seq + 1, last_event_at = now() WHERE id = %s RETURNING last_seq"
)
RAW_INSERT = "INSERT INTO sessions_app_event (session_id, seq, kind, data, created_at) VALUES (%s, %s, %s, %s, now())"
RAW1_SQL = (
    "WITH s AS (UPDATE sessions_app_session SET last_seq = last_seq + 1, last_event_at = now() "
    "WHERE id = %s RETURNING last_seq) "
    "INSERT INTO sessions_app_event (session_id, seq, kind, data, created_at) "
    "SELECT %s, s.last_seq, %s, %s::jsonb, now() FROM s RETURNING seq"
)


# --------------------------------------------------------------------------
# scratch database


def scratch_database(base_url: str, name: str) -> str:
    import psycopg

    parsed = urlparse(base_url)
    if not parsed.scheme.startswith("postgres"):
        sys.exit("bench/append.py needs DATABASE_URL=postgres://... (it compares against raw psycopg)")
    maintenance = urlunparse(parsed._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunparse(parsed._replace(path=f"/{name}"))


def drop_database(base_url: str, name: str) -> None:
    import psycopg

    maintenance = urlunparse(urlparse(base_url)._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "terret_site.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret")
    import django

    django.setup()


# --------------------------------------------------------------------------
# writer processes


def _write(mode: str, sid: uuid.UUID, seconds: float, start_at: float, raw: Any) -> tuple[int, float, float]:
    """Append to `sid` for `seconds` from wall-clock `start_at`."""
    from psycopg.types.json import Jsonb

    from sessions_app.log import append

    payload = Jsonb(PAYLOAD)
    text = json.dumps(PAYLOAD)
    while time.time() < start_at:
        time.sleep(0.0005)
    t0 = time.time()
    end = t0 + seconds
    n = 0
    if mode == "append":
        while time.time() < end:
            append(sid, KIND, PAYLOAD)
            n += 1
    elif mode == "raw":
        cur = raw.cursor()
        while time.time() < end:
            with raw.transaction():
                cur.execute(RAW_SQL, [sid])
                seq = cur.fetchone()[0]
                cur.execute(RAW_INSERT, [sid, seq, KIND, payload])
            n += 1
    elif mode == "raw1":
        cur = raw.cursor()
        while time.time() < end:
            cur.execute(RAW1_SQL, [sid, sid, KIND, text])
            n += 1
            raw.commit()  # no-op in autocommit; keeps the loops alike
    else:
        raise ValueError(mode)
    return n, t0, time.time()


def writer_main(pipe: Connection, url: str) -> None:
    """One writer process: Django (for append) and one raw psycopg
    connection, set up once; then runs commands until told to stop."""
    import psycopg

    os.environ["DATABASE_URL"] = url
    setup_django()
    from django.db import connection

    connection.ensure_connection()
    raw_tx = psycopg.connect(url)
    raw_auto = psycopg.connect(url, autocommit=True)
    pipe.send("ready")
    while True:
        cmd = pipe.recv()
        if cmd is None:
            break
        mode, sid, seconds, start_at = cmd
        raw = raw_auto if mode == "raw1" else raw_tx
        try:
            pipe.send(_write(mode, sid, seconds, start_at, raw))
        except Exception as exc:  # reported, so the parent fails loudly
            pipe.send(repr(exc))
    raw_tx.close()
    raw_auto.close()
    connection.close()


@dataclass
class Pool:
    procs: list[Any]
    pipes: list[Connection]

    def run(self, mode: str, sids: list[uuid.UUID], seconds: float) -> tuple[int, float]:
        """(events, seconds) over all writers; writer i appends to sids[i],
        all starting at the same wall-clock instant."""
        start_at = time.time() + 0.02
        for pipe, sid in zip(self.pipes, sids, strict=False):
            pipe.send((mode, sid, seconds, start_at))
        results = [pipe.recv() for pipe in self.pipes[: len(sids)]]
        for r in results:
            if isinstance(r, str):
                raise RuntimeError(f"writer failed in {mode}: {r}")
        total = sum(r[0] for r in results)
        span = max(r[2] for r in results) - min(r[1] for r in results)
        return total, span

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for p in self.procs:
            p.join(30)


def start_writers(url: str, n: int) -> Pool:
    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    for _ in range(n):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=writer_main, args=(child, url), daemon=True)
        p.start()
        procs.append(p)
        pipes.append(parent)
    for pipe in pipes:
        if not pipe.poll(120) or pipe.recv() != "ready":
            sys.exit("a writer process did not start")
    return Pool(procs, pipes)


# --------------------------------------------------------------------------
# derive_messages


TURN = [
    ("turn/start", {}),
    ("user/message", {"text": "What is the time in Paris, and in Tokyo?"}),
    ("step/start", {"step": 1, "model": "demo/offline"}),
    (
        "assistant/message",
        {"content": None, "tool_calls": [{"id": "call_1", "name": "clock.now", "arguments": '{"tz":"Europe/Paris"}'}]},
    ),
    ("tool/result", {"call_id": "call_1", "name": "clock.now", "content": "2026-11-29T12:00:00+01:00"}),
    ("step/end", {"step": 1, "usage": {"prompt_tokens": 812, "completion_tokens": 31, "cost": 0.0004}}),
    ("assistant/message", {"content": "It is noon in Paris and 8 pm in Tokyo."}),
    ("turn/end", {"status": "completed"}),
]
TAIL = 40


def build_log(url: str, sid: uuid.UUID, n: int) -> None:
    """n events of realistic turns with a compaction TAIL events before the
    end, loaded with COPY: building 100k events through append() would time
    the writes, and what is timed here is the read."""
    import psycopg
    from psycopg.types.json import Jsonb

    compaction_at = n - TAIL
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy("COPY sessions_app_event (session_id, seq, kind, data, created_at) FROM STDIN") as copy:
            for seq in range(1, n + 1):
                if seq == compaction_at:
                    kind, data = "session/compacted", {"upto_seq": seq - 1, "summary": "Earlier: clocks were read."}
                else:
                    kind, data = TURN[seq % len(TURN)]
                copy.write_row((sid, seq, kind, Jsonb(data), "now"))
        cur.execute(
            "UPDATE sessions_app_session SET last_seq = %s, compacted_seq = %s WHERE id = %s", [n, compaction_at, sid]
        )
        conn.commit()


def time_derive(sid: uuid.UUID, calls: int) -> tuple[float, int]:
    from sessions_app.log.projection import derive_messages

    for _ in range(5):
        messages = derive_messages(sid)  # warm caches and the plan
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        derive_messages(sid)
        times.append(time.perf_counter() - t)
    return statistics.median(times), len(messages)


# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slice", type=float, default=0.25, help="seconds per slice (default 0.25)")
    ap.add_argument("--slices", type=int, default=16, help="slices per mode and case (default 16)")
    ap.add_argument("--db", default="terret_bench", help="scratch database name (default terret_bench)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database afterwards")
    args = ap.parse_args()

    base = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/test")
    url = scratch_database(base, args.db)
    os.environ["DATABASE_URL"] = url
    started = time.monotonic()
    try:
        return run(url, args)
    finally:
        if not args.keep:
            drop_database(base, args.db)
        print(f"(finished in {time.monotonic() - started:.0f} s)", file=sys.stderr)


def run(url: str, args: argparse.Namespace) -> int:
    import subprocess

    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env={**os.environ, "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-not-a-secret")},
        capture_output=True,
        text=True,
    )
    if migrate.returncode:
        sys.exit(migrate.stderr)
    setup_django()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection

    from sessions_app.models import Event, Session

    with connection.cursor() as cur:
        cur.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('fsync')"
        )
        version, sync, fsync = cur.fetchone()
    owner = get_user_model().objects.create_user("bench")

    def sessions(n: int) -> list[uuid.UUID]:
        return [Session.objects.create(owner=owner).id for _ in range(n)]

    hints = (
        f"channels-redis at {settings.REDIS_URL} (one hint per commit, coalesced, sent by a background thread)"
        if settings.REDIS_URL
        else "in-memory channel layer (no REDIS_URL): no websocket listener in these processes, hints are dropped"
    )
    print("Terret append benchmark")
    print(
        f"postgres {version} at {urlparse(url).hostname}:{urlparse(url).port or 5432}, scratch db {args.db}; "
        f"synchronous_commit={sync}, fsync={fsync}; {os.cpu_count()} CPUs"
    )
    print(f"hints: {hints}")
    print("writers: separate OS processes (multiprocessing spawn), not threads, so writers share no GIL")
    print(
        f"timing: per case, {args.slices} slices of {args.slice:g} s per mode in rotating order; "
        f"rate = events / time summed over a mode's slices"
    )
    print("raw:    psycopg 3, BEGIN; UPDATE session row (lock + seq) RETURNING; INSERT event; COMMIT")
    print("raw1:   psycopg 3, the one UPDATE-then-INSERT statement append() sends, autocommit")
    print(f"append: sessions_app.log.append() via Django, kind {KIND}")
    connection.close()

    pool = start_writers(url, WRITERS)
    cases = [
        ("1 session", 1, False),
        ("8 sessions", WRITERS, False),
        ("8 writers, 1 session", WRITERS, True),
    ]
    modes = ["raw", "raw1", "append"]
    done: dict[tuple[str, str], list[float]] = {}
    slice_ratios: dict[str, list[float]] = {}
    try:
        for label, writers, shared in cases:
            # Fresh sessions per mode, so no mode appends to a longer log.
            sids = {m: sessions(1) * writers if shared else sessions(writers) for m in modes}
            connection.close()
            for i in range(args.slices):
                order = modes[i % 3 :] + modes[: i % 3]
                got = {m: pool.run(m, sids[m], args.slice) for m in order}
                for m, (events, span) in got.items():
                    acc = done.setdefault((label, m), [0.0, 0.0])
                    acc[0] += events
                    acc[1] += span
                raw_rate = got["raw"][0] / got["raw"][1]
                slice_ratios.setdefault(label, []).append(got["append"][0] / got["append"][1] / raw_rate)
    finally:
        pool.close()
    best = {key: events / span for key, (events, span) in done.items()}

    print()
    print(
        f"{'case':<24}{'raw/s':>10}{'raw1/s':>10}{'append/s':>10}{'append/raw':>12}{'append/raw1':>13}"
        f"{'slices: append/raw median [min-max]':>38}"
    )
    ratios: dict[str, float] = {}
    for label, _, _ in cases:
        raw, raw1, app = (best[(label, m)] for m in modes)
        ratios[label] = app / raw
        flag = "" if ratios[label] >= TARGET_RATIO else f"   BELOW TARGET {TARGET_RATIO}"
        sr = sorted(slice_ratios[label])
        spread = f"{statistics.median(sr):.2f} [{sr[0]:.2f}-{sr[-1]:.2f}]"
        print(
            f"{label:<24}{raw:>10.0f}{raw1:>10.0f}{app:>10.0f}{app / raw:>12.2f}{app / raw1:>13.2f}{spread:>38}{flag}"
        )

    # The log the writers left must be gapless, or the figures mean nothing.
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE n <> last_seq OR lo <> 1 OR hi <> last_seq) FROM ("
            " SELECT s.last_seq, count(e.seq) AS n, min(e.seq) AS lo, max(e.seq) AS hi"
            " FROM sessions_app_session s JOIN sessions_app_event e ON e.session_id = s.id GROUP BY s.id) t"
        )
        checked, broken = cur.fetchone()
    total = Event.objects.count()
    print(f"check: {total} events in {checked} sessions, {broken} with a gap or duplicate")

    print()
    print(f"derive_messages, compaction {TAIL} events before the end, median of 50 calls:")
    timings: dict[int, float] = {}
    for n in (100, 10_000, 100_000):
        (sid,) = sessions(1)
        build_log(url, sid, n)
        with connection.cursor() as cur:
            cur.execute("ANALYZE sessions_app_event")
        median, count = time_derive(sid, 50)
        timings[n] = median
        print(f"  {n:>7} events: {median * 1000:7.2f} ms ({count} messages)")
    derive_ratio = timings[100_000] / timings[100]
    flag = "ok" if derive_ratio <= TARGET_DERIVE else "ABOVE TARGET"
    print(f"derive_messages ratio 100k/100: {derive_ratio:.2f} (target <= {TARGET_DERIVE}: {flag})")
    connection.close()

    print()
    print(f"append/raw ratio (8 writers, 1 session): {ratios['8 writers, 1 session']:.2f}")
    print(f"append/raw ratio (8 sessions): {ratios['8 sessions']:.2f}")
    print(f"append/raw ratio (1 session): {ratios['1 session']:.2f}")
    ok = broken == 0 and min(ratios.values()) >= TARGET_RATIO and derive_ratio <= TARGET_DERIVE
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
