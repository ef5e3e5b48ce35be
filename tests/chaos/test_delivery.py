"""Faults of delivery and of process control, with two workers on the
production lease settings:

- the drive task delivered again and again while a turn runs (the project's
  own `send_drive`, from the probe process): one model request per step,
  counted at the model server, and the tool run once;
- SIGTERM of the driving worker of two mid-turn, as a deploy sends it: it
  exits 0, the other goes on at the next step, no step is asked twice;
- the driving worker SIGSTOPped until its lease expires and the other takes
  the turn over, then SIGCONTed: fenced, it writes nothing of the turn (only
  what its model request cost, usage/recorded, unfenced by design so spend
  matches what the provider billed).
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos import harness
from tests.chaos.harness import Chaos, first_then, tool_then_final
from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.chaos]

DUPLICATES = 5  # drive tasks sent at each of three points of the turn
HANDOVER_WITHIN = 1.0  # SIGTERM: from step 1's commit to step 2's start
TAKEOVER_WITHIN = 60.0  # SIGSTOP: the 30 s lease, found by a 15 s sweep, plus slack


@pytest.mark.timeout(120)
def test_duplicate_delivery_of_the_drive_task(chaos: Chaos) -> None:
    sid = chaos.new_session()
    text = f"delivered many times {time.monotonic_ns()}"
    plan = tool_then_final(
        ("debug.sleep", {"seconds": 1.5}), first=Reply(latency=1.5), final=Reply(text="done", latency=1.0)
    )
    chaos.post(sid, text, plan)
    harness.wait_until(lambda: chaos.model.requests(text), 20, "step 1's request", chaos.stack)
    sent = chaos.probe.wake(sid, DUPLICATES)  # mid model call
    chaos.wait_kind(sid, "tool/attempt", timeout=20)
    sent += chaos.probe.wake(sid, DUPLICATES)  # mid tool
    harness.wait_until(lambda: len(chaos.model.requests(text)) >= 2, 20, "step 2's request", chaos.stack)
    sent += chaos.probe.wake(sid, DUPLICATES)  # mid step 2
    chaos.wait_kind(sid, "turn/end", timeout=30)
    sent += chaos.probe.wake(sid, DUPLICATES)  # after the turn
    time.sleep(1.5)  # every duplicate has been taken by now
    report = chaos.check([sid])
    events = chaos.events(sid)
    requests = len(chaos.model.requests(text))
    steps = len({e.data["step"] for e in events if e.kind == "step/end"})
    attempts = sum(e.kind == "tool/attempt" for e in events)
    harness.summary(
        "duplicate delivery", drive_tasks_sent=sent + 1, turns=report.turns, model_requests=requests, steps=steps,
        tool_runs=attempts,
    )  # fmt: skip
    assert steps == 2
    assert requests == steps, "one model request per step"
    assert attempts == 1, "the tool ran once"


@pytest.mark.timeout(120)
def test_sigterm_of_one_of_two_workers_mid_turn(chaos: Chaos) -> None:
    sid = chaos.new_session()
    text = f"deployed away {time.monotonic_ns()}"
    plan = tool_then_final(("debug.noop", {}), first=Reply(latency=1.0), final=Reply(text="done", latency=1.0))
    chaos.post(sid, text, plan)
    harness.wait_until(lambda: chaos.model.requests(text), 20, "step 1's request", chaos.stack)
    leaving = chaos.driver(sid)
    time.sleep(chaos.rng.uniform(0.1, 0.6))
    sent_at = chaos.signal(leaving, signal.SIGTERM)
    ended = chaos.wait_kind(sid, "turn/end", timeout=60)
    code = leaving.proc.wait(30)
    exited = time.time()
    report = chaos.check([sid])
    events = chaos.events(sid)
    step1_end = next(e.at for e in events if e.kind == "step/end" and e.data["step"] == 1)
    step2_start = next(e.at for e in events if e.kind == "step/start" and e.data["step"] == 2)
    requests = len(chaos.model.requests(text))
    steps = len({e.data["step"] for e in events if e.kind == "step/end"})
    harness.summary(
        "sigterm", exit_code=code, exited_after_s=exited - sent_at, handover_s=step2_start - step1_end,
        turn_end_after_sigterm_s=ended - sent_at, turns=report.turns, model_requests=requests, steps=steps,
    )  # fmt: skip
    assert code == 0, leaving.output()[-3000:]
    assert "'handed_off'" in leaving.output()
    assert steps == 2 and requests == steps, "no step asked twice"
    assert step2_start - step1_end < HANDOVER_WITHIN


@pytest.mark.timeout(180)
def test_sigstop_past_the_lease_then_sigcont_writes_nothing(chaos: Chaos) -> None:
    sid = chaos.new_session()
    text = f"frozen past its lease {time.monotonic_ns()}"
    chaos.post(sid, text, first_then(Reply(text="the late answer", latency=1.0), Reply(text="recovered")))
    harness.wait_until(lambda: chaos.model.requests(text), 20, "the model request", chaos.stack)
    frozen = chaos.driver(sid)
    stopped_at = chaos.signal(frozen, signal.SIGSTOP)
    try:
        ended = chaos.wait_kind(sid, "turn/end", timeout=TAKEOVER_WITHIN)
        taken_over = chaos.events(sid)
    finally:
        resumed_at = chaos.signal(frozen, signal.SIGCONT)
    # Its model reply has been waiting in its socket: it goes on, finds its lease superseded, gives up.
    harness.wait_until(lambda: "'lost'" in frozen.output(), 30, "the woken drive giving up", chaos.stack)
    time.sleep(0.5)
    report = chaos.check([sid])
    after = chaos.events(sid)
    late = after[len(taken_over) :]
    harness.summary(
        "sigstop past the lease", frozen_s=resumed_at - stopped_at, takeover_after_stop_s=ended - stopped_at,
        events_written_after_sigcont=len(late), of_kinds=",".join(e.kind for e in late) or "-",
        turns=report.turns, model_requests=len(chaos.model.requests(text)),
    )  # fmt: skip
    assert after[: len(taken_over)] == taken_over, "nothing of the taken-over turn changed"
    assert [e.kind for e in late] == ["usage/recorded"], "fenced: only its spend"
    assert "lease was lost" in late[0].data["reason"]
    assert [e.data["content"] for e in after if e.kind == "assistant/message"] == ["recovered"]
    assert frozen.alive(), "the woken worker keeps running"
