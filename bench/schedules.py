"""Scheduled wake-ups at volume, through real Celery workers on PostgreSQL and Redis.

  DATABASE_URL=postgres://root@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/11 \\
      .venv/bin/python bench/schedules.py

1,000 one-shot schedules on 1,000 sessions, due evenly within one minute,
fired by 2 worker processes on the default settings (each worker's clock
polls every TERRET_SCHEDULE_POLL_SECONDS, 0.5 s), each firing a turn through
the local fake model. Lateness is the time from a schedule's due time to
the commit of its schedule/fired (read from the event's own timestamp, not
from what the clock says about itself). Printed: p50, p99 and the worst,
the same as a multiple of the clock's poll period (the floor a poller can
reach), how the firings split across the two workers, and duplicates:
schedule/fired events beyond one per schedule, and turns beyond one per
session. Targets: p50 and p99 <= 1 s; duplicates 0. Exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._setup import scratch_database  # noqa: E402
from bench.turns import kill, make_sessions, purge, settle, start_worker, wait_ready  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--window", type=float, default=60.0, help="seconds the due times spread over")
    parser.add_argument("--workers", type=int, default=2)
    opts = parser.parse_args()
    scratch_database("terret_bench_schedules")

    from django.conf import settings
    from django.utils import timezone

    from sessions_app.models import Event, Schedule
    from sessions_app.services import schedules
    from tests.fakes.fake_llm import FakeLLM, Reply

    n = opts.schedules
    with FakeLLM(lambda body: Reply(text="checked", usage=(10, 5, None))) as fake:
        purge()
        env = {"TERRET_LLM_BASE_URL": fake.base_url, "TERRET_LLM_API_KEY": "bench"}
        procs = [start_worker(f"sched{i}", 16, **env) for i in range(opts.workers)]
        try:
            wait_ready(procs[0], workers=opts.workers)
            settle(procs)
            sessions = make_sessions(n, "sched", ["debug.noop"])
            first = timezone.now() + timedelta(seconds=max(10.0, n / 150))
            step = opts.window / n
            for i, s in enumerate(sessions):
                due = first + timedelta(seconds=i * step)
                schedules.create(s.id, {"text": f"wake {i}", "due_at": due}, by="bench")
            print(f"{n} schedules due from {first:%H:%M:%S} over {opts.window:.0f} s; {opts.workers} workers, "
                  f"poll {settings.TERRET_SCHEDULE_POLL_SECONDS} s (default settings)")  # fmt: skip
            deadline = time.monotonic() + opts.window + 180
            ids = [s.id for s in sessions]
            while time.monotonic() < deadline:
                ended = Event.objects.filter(session_id__in=ids, kind="turn/end").count()
                if ended >= n and not Schedule.objects.filter(status="pending").exists():
                    break
                time.sleep(0.5)
            time.sleep(2.0)  # a duplicate firing would land by now
        finally:
            for p in procs:
                kill(p)
        requests = len(fake.requests)
    return report(n, ids, requests, settings.TERRET_SCHEDULE_POLL_SECONDS)


def report(n: int, ids: list[Any], requests: int, poll: float) -> int:
    from datetime import datetime

    from sessions_app.models import Event, Schedule

    due = {str(s.id): s for s in Schedule.objects.filter(session_id__in=ids)}
    fired = list(Event.objects.filter(session_id__in=ids, kind="schedule/fired").values_list("data", "created_at"))
    per_schedule = Counter(d["schedule_id"] for d, _ in fired)
    late: list[float] = []
    seen: set[str] = set()
    for data, at in fired:
        if data["schedule_id"] in seen:
            continue
        seen.add(data["schedule_id"])
        late.append((at - datetime.fromisoformat(data["due_at"])).total_seconds())
    late.sort()
    turns = Counter(Event.objects.filter(session_id__in=ids, kind="turn/start").values_list("session_id", flat=True))
    dup_fired = sum(c - 1 for c in per_schedule.values() if c > 1)
    dup_turns = sum(c - 1 for c in turns.values() if c > 1)
    by_worker = Counter(d.get("worker", "?") for d, _ in fired)
    completed = sum(1 for s in due.values() if s.status == "completed")
    if len(late) < n:
        print(f"only {len(late)} of {n} schedules fired")
        return 1
    p50, p99 = statistics.median(late), late[max(0, int(len(late) * 0.99) - 1)]
    print(f"lateness: p50 {p50:.3f} s, p99 {p99:.3f} s, worst {late[-1]:.3f} s "
          f"({p50 / poll:.2f} / {p99 / poll:.2f} poll periods)")  # fmt: skip
    print(f"firings by worker: {', '.join(f'{w} {c}' for w, c in sorted(by_worker.items()))}")
    print(f"duplicates: {dup_fired} extra schedule/fired, {dup_turns} extra turns; completed {completed}/{n}; "
          f"model requests {requests} for {n} turns")  # fmt: skip
    ok = p50 <= 1.0 and p99 <= 1.0 and dup_fired == 0 and dup_turns == 0 and requests == n and completed == n
    print("targets (p50, p99 <= 1 s; duplicates 0):", "met" if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
