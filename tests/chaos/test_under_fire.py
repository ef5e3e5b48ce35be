"""Issue 27, "Under fire", from outside: bursts of concurrent input through
the stack's own doors while a slow turn streams, on the production settings.

Each round opens a session, starts a slow turn (about 1 s of streaming), and
fires INPUTS inputs at it from THREADS client threads, with cancels and
duplicate drive tasks among them:

- *interrupt* rounds: every input is a `/lg/` run with `multitask_strategy:
  interrupt` (issue 27 saw a second turn/start in 2 of 4 such rounds);
- *mixed* rounds: follow-ups (`lane: follow_up`, and `/lg/` enqueues) mixed
  with plain input through the API.

Two rounds of each kind also kill -9 the driving worker mid-burst and start
a replacement (a takeover). After every round, on top of the checks every
drill makes (`Chaos.check`): no turn/start while a turn is open, every
follow-up in a turn of its own in arrival order (never another input's
context), every input's receipt read back from the API true of the log and
answered (or withdrawn), and every `/lg/` run ended.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.chaos import harness, invariants
from tests.chaos.harness import Chaos, streamed

pytestmark = [pytest.mark.chaos]

ROUNDS = int(os.environ.get("TERRET_CHAOS_FIRE_ROUNDS", "8"))
INPUTS = 30
THREADS = 8
KILL_ROUNDS = (2, 5)
INPUT_KINDS = ("input/queued", "input/deferred", "user/message")


@pytest.mark.timeout(1200)
def test_under_fire_one_open_turn_and_lanes(chaos: Chaos) -> None:
    figures = {"rounds": 0, "inputs": 0, "turns": 0, "cancelled": 0, "lg_runs": 0, "kills": 0, "requests": 0}
    started = time.monotonic()
    for number in range(ROUNDS):
        for mode in ("interrupt", "mixed"):
            round_figures = fire_round(chaos, mode, kill=number in KILL_ROUNDS)
            for name, value in round_figures.items():
                figures[name] += value
            figures["rounds"] += 1
        chaos.ensure_workers(2)
    harness.summary("under fire", seconds=time.monotonic() - started, **figures)
    assert figures["rounds"] == 2 * ROUNDS


def fire_round(chaos: Chaos, mode: str, *, kill: bool) -> dict[str, int]:
    sid = chaos.new_session()
    slow = f"slow turn {time.monotonic_ns()}"
    chaos.post(sid, slow, lambda n, body: streamed(1.0, delay=0.05))
    harness.wait_until(lambda: chaos.model.requests(slow), 20, "the slow turn's request", chaos.stack)
    asked = chaos.model.total()
    runs: list[str] = []
    moves = _moves(chaos, sid, mode, runs)
    killer = threading.Thread(target=_kill_driver, args=(chaos, sid)) if kill else None
    if killer is not None:
        killer.start()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda move: move(), moves))
    if killer is not None:
        killer.join()
    report = chaos.check([sid], timeout=120)  # settles first; log, input and effect checks
    events = chaos.events(sid)
    receipts = _receipts(chaos, sid, events)
    problems = invariants.lane_problems(events) + invariants.receipt_problems(events, receipts)
    problems += [
        f"input {r['seq']} is {r['disposition']}" for r in receipts if r["disposition"] not in ("answered", "withdrawn")
    ]
    statuses = [_lg_status(chaos, sid, run) for run in runs]
    problems += [
        f"/lg/ run {run} is {status}"
        for run, status in zip(runs, statuses, strict=True)
        if status in ("pending", "running")
    ]
    assert not problems, (
        f"round ({mode}) of {sid}:\n  " + "\n  ".join(problems) + "\n  " + harness.timeline(events, events[0].at)
    )
    return {
        "inputs": len(receipts),
        "turns": report.turns,
        "cancelled": sum(e.kind == "turn/end" and e.data.get("status") == "cancelled" for e in events),
        "lg_runs": len(runs),
        "kills": int(kill),
        "requests": chaos.model.total() - asked,
    }


def _moves(chaos: Chaos, sid: str, mode: str, runs: list[str]) -> list[Callable[[], None]]:
    lock = threading.Lock()

    def lg(text: str, strategy: str) -> Callable[[], None]:
        def move() -> None:
            body = {"assistant_id": harness.PROFILE, "input": {"messages": [{"role": "user", "content": text}]}}
            r = chaos._retrying("POST", f"/lg/threads/{sid}/runs", json={**body, "multitask_strategy": strategy})
            assert r.status_code == 200, r.text
            with lock:
                runs.append(str(r.json()["run_id"]))

        return move

    def api(text: str, **body: Any) -> Callable[[], None]:
        def move() -> None:
            r = chaos._retrying("POST", f"/api/sessions/{sid}/inputs", json={"text": text, **body})
            assert r.status_code == 202, r.text

        return move

    def cancel() -> None:
        r = chaos._retrying("POST", f"/api/sessions/{sid}/cancel", json={})
        assert r.status_code == 200, r.text

    def wakes() -> None:
        chaos.probe.wake(sid, 5)

    out: list[Callable[[], None]] = []
    for i in range(INPUTS):
        text = f"{mode} {i} {time.monotonic_ns()}"
        if mode == "interrupt":
            out.append(lg(text, "interrupt"))
        else:
            out.append(chaos.rng.choice([api(text, lane="follow_up"), api(text), lg(text, "enqueue")]))
    out += [cancel] * 3 + [wakes] * 3
    chaos.rng.shuffle(out)
    return out


def _kill_driver(chaos: Chaos, sid: str) -> None:
    """A takeover mid-burst: kill -9 the worker holding the lease; a replacement starts at once."""
    time.sleep(chaos.rng.uniform(0.05, 0.4))
    victim = chaos.driver(sid, timeout=10)
    chaos.signal(victim, signal.SIGKILL)
    chaos.replace(victim)


def _receipts(chaos: Chaos, sid: str, events: list[invariants.Ev]) -> list[dict[str, Any]]:
    """Every input of the log, its receipt read back from the API."""
    seqs = [
        e.seq for e in events if e.kind in INPUT_KINDS and not (e.kind == "user/message" and "source_seq" in e.data)
    ]
    out = []
    for seq in seqs:
        r = chaos._retrying("GET", f"/api/sessions/{sid}/inputs/{seq}")
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def _lg_status(chaos: Chaos, sid: str, run: str) -> str:
    r = chaos._retrying("GET", f"/lg/threads/{sid}/runs/{run}")
    assert r.status_code == 200, r.text
    return str(r.json()["status"])
