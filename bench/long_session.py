"""Step overhead on a 100k-event session with compactions vs a fresh session.

  DATABASE_URL=postgres://root@127.0.0.1:5432/terret_h5 .venv/bin/python bench/long_session.py

Set-up (not timed): a scratch database; a "long" session whose log holds
--events events (default 100,000: closed turns with a tool call each, and a
session/compacted every --compact-every events, the last one at the head),
bulk-loaded with COPY, its Session projection columns and UsageDay row set to
exactly what appending those events would have produced (checked against the
log before timing); and a "fresh" session with an empty log.

Timed, interleaved long/fresh, in this one process: real turns through the
real loop (services.run_turn, then loop.drive synchronously): lease, turn
state, derive_messages, a model call to the local SSE server answering at
once, and every append of a one-step turn. Also timed separately: one
derive_messages call, the per-step read that could grow with the log.

The last line prints the ratio long/fresh of the median turn time. Target <= 1.2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._setup import scratch_database  # noqa: E402

os.environ["TERRET_WORKER"] = "manual"  # this process drives turns itself, synchronously
os.environ.setdefault("TERRET_MAX_AGENTS", "1000")
os.environ.pop("REDIS_URL", None)  # hints and wake-ups are not what is measured
os.environ.setdefault("LOG_LEVEL", "WARNING")

TURN_USAGE = {"prompt_tokens": 900, "completion_tokens": 40, "cost": 0.0005}


def _turn_events(n: int) -> list[tuple[str, dict[str, Any]]]:
    """One closed turn with a tool call: 10 events."""
    call = {"id": f"call_{n}", "name": "debug.noop", "arguments": "{}"}
    return [
        ("turn/start", {}),
        ("user/message", {"text": f"request number {n}: please do the next part of the job"}),
        ("step/start", {"step": 1, "model": "bench/main"}),
        ("assistant/message", {"content": None, "tool_calls": [call], "usage": TURN_USAGE}),
        ("tool/result", {"call_id": call["id"], "name": "debug.noop", "content": "ok", "is_error": False}),
        ("step/end", {"step": 1, "usage": TURN_USAGE}),
        ("step/start", {"step": 2, "model": "bench/main"}),
        ("assistant/message", {"content": f"Done with part {n}.", "tool_calls": [], "usage": TURN_USAGE}),
        ("step/end", {"step": 2, "usage": TURN_USAGE}),
        ("turn/end", {"status": "completed"}),
    ]


def build_long_session(session_id: uuid.UUID, start_seq: int, total: int, compact_every: int) -> dict[str, Any]:
    """COPY `total` events after `start_seq`; returns the projection to set."""
    from django.db import connection

    from sessions_app.services.usage import entry_totals

    now = datetime.now(UTC)
    seq = start_seq
    compacted_seq: int | None = None
    totals = None
    n = 0
    rows: list[tuple[Any, ...]] = []
    while seq < start_seq + total - 1:
        n += 1
        for kind, data in _turn_events(n):
            seq += 1
            rows.append((session_id, seq, kind, json.dumps(data), now))
            t = entry_totals(kind, data)
            totals = t if totals is None else totals + t
        if (seq - start_seq) // compact_every != (seq - start_seq - 10) // compact_every:
            seq += 1
            summary = f"Summary after {n} turns: parts 1..{n} of the job are done."
            rows.append(
                (session_id, seq, "session/compacted", json.dumps({"upto_seq": seq - 1, "summary": summary}), now)
            )
            compacted_seq = seq
    # the head is a compaction, as a long session normally is after its trigger
    if compacted_seq != seq:
        seq += 1
        rows.append((session_id, seq, "session/compacted", json.dumps({"upto_seq": seq - 1, "summary": "latest"}), now))
        compacted_seq = seq
    raw = connection.connection  # psycopg.Connection
    with (
        raw.cursor() as cur,
        cur.copy("COPY sessions_app_event (session_id, seq, kind, data, created_at) FROM STDIN") as cp,
    ):
        for row in rows:
            cp.write_row(row)
    assert totals is not None
    return {"last_seq": seq, "compacted_seq": compacted_seq, "totals": totals, "at": now, "events": len(rows)}


def set_projection(session_id: uuid.UUID, profile_id: int, p: dict[str, Any]) -> None:
    """What appending those events one by one would have left behind."""
    from django.db import connection

    from sessions_app.log.runs import tally_shard

    t = p["totals"]
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE sessions_app_session SET last_seq = %s, last_event_at = %s, compacted_seq = %s, "
            "open_turn_seq = NULL, pending_approvals = 0, steps = steps + %s, "
            "unpriced_entries = unpriced_entries + %s, prompt_tokens = prompt_tokens + %s, "
            "completion_tokens = completion_tokens + %s, cost = cost + %s "
            "WHERE id = %s",
            [p["last_seq"], p["at"], p["compacted_seq"], t.steps, t.unpriced, t.prompt_tokens, t.completion_tokens,
             t.cost, session_id],
        )  # fmt: skip
        cur.execute(
            "INSERT INTO sessions_app_usageday (day, profile_id, shard, steps, unpriced_entries, prompt_tokens, "
            "completion_tokens, cost) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (day, profile_id, shard) DO UPDATE SET "
            "steps = sessions_app_usageday.steps + excluded.steps, "
            "unpriced_entries = sessions_app_usageday.unpriced_entries + excluded.unpriced_entries, "
            "prompt_tokens = sessions_app_usageday.prompt_tokens + excluded.prompt_tokens, "
            "completion_tokens = sessions_app_usageday.completion_tokens + excluded.completion_tokens, "
            "cost = sessions_app_usageday.cost + excluded.cost",
            [
                p["at"].date(),
                profile_id,
                tally_shard(session_id),
                t.steps,
                t.unpriced,
                t.prompt_tokens,
                t.completion_tokens,
                t.cost,
            ],
        )
        cur.execute("ANALYZE sessions_app_event")
        cur.execute("ANALYZE sessions_app_session")


def timed_turn(session_id: uuid.UUID, text: str) -> float:
    from sessions_app import services
    from sessions_app.runtime.drive import drive

    services.run_turn(session_id, text)
    t0 = time.perf_counter()
    outcome = drive(session_id)
    elapsed = time.perf_counter() - t0
    if outcome != "ended":
        raise RuntimeError(f"turn on {session_id} ended as {outcome!r}")
    return elapsed


def timed_derive(session_id: uuid.UUID) -> float:
    from sessions_app.log.projection import derive_messages

    t0 = time.perf_counter()
    derive_messages(session_id)
    return time.perf_counter() - t0


def ms(values: list[float]) -> str:
    q = statistics.quantiles(values, n=10)
    return f"median {statistics.median(values) * 1000:7.2f} ms  p10 {q[0] * 1000:7.2f}  p90 {q[-1] * 1000:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--compact-every", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=60, help="timed turns per session")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--db", default="terret_bench_long_session")
    opts = parser.parse_args()

    scratch_database(opts.db)
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from sessions_app import services
    from sessions_app.models import AgentProfile, Event, Session
    from sessions_app.services.usage import check_session
    from tests.fakes.fake_llm import FakeLLM, Reply

    fake = FakeLLM(lambda body: Reply(text="done", usage=(len(body["messages"]) * 10, 2, 0.0001))).start()
    settings.TERRET_LLM_BASE_URL = fake.base_url
    settings.TERRET_LLM_API_KEY = "bench"
    try:
        user = get_user_model().objects.create_user("bench", password="bench-pw")
        profile = AgentProfile.objects.create(
            name="bench", roles={"main": "bench/main"}, builtin_tools=["debug.noop"], allow_floor=["*"]
        )
        long_s = services.create_session(user, profile)
        fresh_s = services.create_session(user, profile)

        t0 = time.perf_counter()
        head = Session.objects.get(id=long_s.id).last_seq
        projection = build_long_session(long_s.id, head, opts.events, opts.compact_every)
        set_projection(long_s.id, profile.id, projection)
        build_s = time.perf_counter() - t0
        compactions = Event.objects.filter(session_id=long_s.id, kind="session/compacted").count()
        ok, running, summed = check_session(long_s.id)
        if not ok:
            raise SystemExit(f"projection mismatch: running {running} vs log {summed}")
        print(
            f"long session: {projection['last_seq']} events ({projection['events']} bulk-loaded in {build_s:.1f}s), "
            f"{compactions} compactions, projection == log sum ({running.steps} steps, {running.cost_display})"
        )

        for i in range(opts.warmup):
            timed_turn(long_s.id, f"warm-up {i}")
            timed_turn(fresh_s.id, f"warm-up {i}")
        long_t: list[float] = []
        fresh_t: list[float] = []
        long_d: list[float] = []
        fresh_d: list[float] = []
        for i in range(opts.turns):
            pair = [(long_s.id, long_t, long_d), (fresh_s.id, fresh_t, fresh_d)]
            if i % 2:
                pair.reverse()  # alternate who goes first
            for sid, turns, derives in pair:
                turns.append(timed_turn(sid, f"timed turn {i}"))
                derives.append(timed_derive(sid))

        ok, _, _ = check_session(long_s.id)
        long_events = Session.objects.get(id=long_s.id).last_seq
        fresh_events = Session.objects.get(id=fresh_s.id).last_seq
        print(
            f"turns timed per session: {opts.turns} (one step each: step/start, model, assistant, step/end, turn/end)"
        )
        print(f"long  ({long_events:>6} events) turn:   {ms(long_t)}")
        print(f"fresh ({fresh_events:>6} events) turn:   {ms(fresh_t)}")
        print(f"long  derive_messages:        {ms(long_d)}")
        print(f"fresh derive_messages:        {ms(fresh_d)}")
        print(f"running totals still equal the log sum: {ok}")
        ratio = statistics.median(long_t) / statistics.median(fresh_t)
        print(f"step overhead ratio long/fresh (median turn): {ratio:.3f} (target <= 1.2)")
    finally:
        fake.stop()  # the scratch database is dropped by the next run


if __name__ == "__main__":
    main()
