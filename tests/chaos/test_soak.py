"""A 3-minute soak: input admitted at a steady rate across a pool of
sessions (two-step turns: a tool call, then the answer), while one of the
two workers is killed with SIGKILL and a fresh one started every 40 s. The
other worker runs throughout; its resident set is read after a warm-up of
the same load and at the end, and may grow by less than 20%.

Nothing is lost: every accepted input ended in a turn/end (or rode into a
running turn that did), every turn is whole, every effect accounted for
(invariants.py, on every session of the pool).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.chaos import harness
from tests.chaos.harness import Chaos, rss_kib
from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.chaos]

SOAK_SECONDS = float(os.environ.get("TERRET_CHAOS_SOAK_SECONDS") or 180)
KILL_EVERY = 40.0
RATE = 2.0  # inputs per second
SESSIONS = 24
WARMUP_SECONDS = 15.0
RSS_GROWTH = 0.20


def plan(n: int, body: dict) -> Reply:  # type: ignore[type-arg]
    if harness.last_role(body) == "tool":
        return Reply(text="done", latency=0.3)
    return Reply(tool_calls=[("debug.noop", {})], latency=0.3)


def admit(chaos: Chaos, sids: list[str], seconds: float, label: str, stop: threading.Event) -> int:
    """Post RATE inputs a second, round-robin over the sessions; how many were accepted."""
    sent = 0
    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        while time.monotonic() - start < seconds and not stop.is_set():
            sid = sids[sent % len(sids)]
            text = f"{label} {sent} {time.monotonic_ns()}"
            chaos.model.plans[text] = plan
            pool.submit(chaos.post, sid, text)
            sent += 1
            time.sleep(max(0.0, start + sent / RATE - time.monotonic()))
    return sent


@pytest.mark.timeout(int(SOAK_SECONDS) + 240)
def test_soak_with_a_worker_killed_every_40s(chaos: Chaos) -> None:
    sids = [chaos.new_session() for _ in range(SESSIONS)]
    steady, victim = chaos.alive()[:2]
    stop = threading.Event()
    requests_before = chaos.model.total()
    warm = admit(chaos, sids, WARMUP_SECONDS, "warm-up", stop)
    rss_start = rss_kib(steady.pid)

    kills: list[float] = []

    def killer() -> None:
        nonlocal victim
        while not stop.wait(KILL_EVERY):
            kills.append(chaos.signal(victim, signal.SIGKILL))
            victim = chaos.replace(victim)

    thread = threading.Thread(target=killer, name="chaos-killer", daemon=True)
    started = time.time()
    thread.start()
    try:
        sent = admit(chaos, sids, SOAK_SECONDS, "soak", stop)
    finally:
        stop.set()
        thread.join(30)
    admitted_for = time.time() - started
    report = chaos.check(sids, timeout=120)
    settled_after = time.time() - started - admitted_for
    rss_end = rss_kib(steady.pid)
    accepted = sum(len(chaos.receipts[s]) for s in sids)
    growth = rss_end / rss_start - 1
    harness.summary(
        "soak", seconds=admitted_for, rate_per_s=RATE, inputs_accepted=accepted, turns=report.turns,
        kills=len(kills), settled_after_s=settled_after, model_requests=chaos.model.total() - requests_before,
        steps=report.steps,
        steady_worker_rss_start_mib=rss_start / 1024, rss_end_mib=rss_end / 1024, rss_growth_pct=growth * 100,
    )  # fmt: skip
    assert steady.alive()
    assert len(kills) >= int(SOAK_SECONDS // KILL_EVERY) - 1
    assert accepted == sent + warm, "every post was accepted"
    assert growth < RSS_GROWTH, f"the steady worker's RSS grew {growth:.0%}: {rss_start} -> {rss_end} KiB"
