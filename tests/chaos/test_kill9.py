"""kill -9 of a worker at six points of a turn, each several times, in an
order drawn from the pass's seed (TERRET_CHAOS_SEED replays it).

Two workers with the production lease settings; the one driving the turn
(the lease's owner) is killed, a replacement starts at once, and the
survivor (through the dead process's liveness lock) finishes the turn. The
points:

- before_step: the step's model request is out, no byte of the reply came back;
- mid_stream: the reply is streaming;
- after_message: the assistant message with its tool call and the call's
  intent are committed, the tool has not run (the `after_intent` failpoint
  of workspace.write holds it there);
- mid_tool: debug.sleep is running;
- after_result: the tool's result is committed, step 2's model request is out;
- parked: the turn waits for an approval of debug.charge (no worker holds
  it); a worker dies and the approval comes right after.

Each round: one model request per step, plus at most the interrupted step
once more (counted at the model server); debug.charge runs exactly once
(counted in its target file); then every invariant (invariants.py).
Recovery is from the kill to the turn/end, less the tool time that the
re-run had to redo.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.chaos import harness
from tests.chaos.harness import WRITE_PAUSE, Chaos, Plan, first_then, streamed, tool_then_final
from tests.fakes.fake_llm import Reply
from tests.stack import AppProcess

pytestmark = [pytest.mark.chaos]

REPEATS = int(os.environ.get("TERRET_CHAOS_KILL_REPEATS") or 2)
# From the kill to the turn/end, beyond the work the re-run had to redo.
RECOVERY_WITHIN = 5.0
HELD = 30.0  # a first reply held this long: far past the kill


@dataclass(frozen=True)
class Point:
    name: str
    plan: Callable[[], Plan]
    steps: int
    redo: float = 0.0  # seconds of tool work the re-run repeats (a failpoint's pause, a sleep)


POINTS = [
    Point("before_step", lambda: first_then(Reply(text="late", latency=HELD), Reply(text="ok")), 1),
    Point("mid_stream", lambda: first_then(streamed(6.0), Reply(text="redone")), 1),
    Point(
        "after_message",
        lambda: tool_then_final(("workspace.write", {"path": "r.txt", "content": "x"})),
        2,
        redo=WRITE_PAUSE,
    ),  # fmt: skip
    Point("mid_tool", lambda: tool_then_final(("debug.sleep", {"seconds": 4})), 2, redo=4.0),
    Point("after_result", lambda: tool_then_final(("debug.noop", {}), final=Reply(text="late", latency=HELD)), 2),
    Point("parked", lambda: tool_then_final(("debug.charge", {"seconds": 0})), 2),
]
ROUNDS = [(i, p) for i, p in enumerate(POINTS * REPEATS)]
random.Random(harness.seed()).shuffle(ROUNDS)
FIGURES: list[dict[str, Any]] = []


def arm(chaos: Chaos, point: Point, sid: str, text: str) -> AppProcess:
    """Wait until the turn is at `point` (plus a random bit); the worker to kill."""
    jitter = chaos.rng.uniform
    if point.name in ("before_step", "mid_stream"):
        harness.wait_until(lambda: chaos.model.requests(text), 20, "the model request", chaos.stack)
        time.sleep(jitter(0.1, 0.6) if point.name == "before_step" else jitter(0.5, 2.5))
    elif point.name in ("after_message", "mid_tool"):
        chaos.wait_kind(sid, "tool/attempt", timeout=20)
        # the write's failpoint holds for WRITE_PAUSE; debug.sleep sleeps 4 s
        time.sleep(jitter(0.2, WRITE_PAUSE - 0.5) if point.name == "after_message" else jitter(0.5, 3.0))
    elif point.name == "after_result":
        chaos.wait_kind(sid, "tool/result", timeout=20)
        harness.wait_until(lambda: len(chaos.model.requests(text)) >= 2, 20, "step 2's request", chaos.stack)
        time.sleep(jitter(0.1, 0.6))
    else:  # parked: nobody drives it; any worker dies
        chaos.wait_kind(sid, "approval/requested", timeout=20)
        harness.wait_until(lambda: not chaos.driver_pid(sid), 20, "the turn to park", chaos.stack)
        return chaos.rng.choice(chaos.alive())
    return chaos.driver(sid)


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    if not FIGURES:
        return
    recoveries = [f["recovery"] for f in FIGURES]
    harness.summary(
        "kill -9",
        rounds=len(FIGURES),
        seed=harness.seed(),
        recovery_p50_s=harness.pct(recoveries, 0.5),
        recovery_max_s=max(recoveries),
        turns=sum(f["turns"] for f in FIGURES),
        model_requests=sum(f["requests"] for f in FIGURES),
        steps=sum(f["steps"] for f in FIGURES),
        rounds_in_order=",".join(f"{f['point']}:{f['recovery']:.2f}s" for f in FIGURES),
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index,point", ROUNDS, ids=[f"{n:02d}-{p.name}" for n, (_, p) in enumerate(ROUNDS)])
def test_kill_9(chaos: Chaos, index: int, point: Point) -> None:
    sid = chaos.new_session()
    text = f"kill {point.name} #{index} {time.monotonic_ns()}"
    chaos.post(sid, text, point.plan())
    victim = arm(chaos, point, sid, text)
    killed_at = chaos.signal(victim, signal.SIGKILL)
    chaos.replace(victim)
    origin = killed_at
    if point.name == "parked":
        call_id = next(e for e in chaos.events(sid) if e.kind == "approval/requested").data["call_id"]
        chaos.approve(sid, call_id)
        origin = time.time()

    ended_at = chaos.wait_kind(sid, "turn/end", timeout=60)
    round_report = chaos.check([sid])
    events = chaos.events(sid)
    requests = len(chaos.model.requests(text))
    steps = len({e.data["step"] for e in events if e.kind == "step/end"})
    recovery = ended_at - origin - point.redo
    FIGURES.append(
        {"point": point.name, "recovery": recovery, "requests": requests, "steps": steps, "turns": round_report.turns}
    )
    print(f"[chaos] kill -9 {point.name}: recovery {recovery:.2f}s, requests {requests}, steps {steps}")
    assert [e.data["status"] for e in events if e.kind == "turn/end"] == ["completed"]
    assert steps == point.steps
    assert point.steps <= requests <= point.steps + 1, "one request per step, the killed one at most once more"
    if point.name == "parked":
        assert harness.charges(chaos.stack, sid) == 1, "the approved charge ran exactly once"
        assert requests == point.steps, "a parked turn redoes no step"
    assert recovery < RECOVERY_WITHIN, f"recovered {recovery:.2f}s after the kill\n{chaos.stack.logs()}"
