"""The stack's own PostgreSQL and Redis taken away mid-turn (never the
machine's shared services: tests/stack.py runs private ones).

- PostgreSQL restarted (stop, start at once) while a turn streams, with
  another turn parked on an approval that is given after the restart;
- PostgreSQL down for 20 s while a turn streams; input posted meanwhile is
  refused (not silently lost), input after its return runs;
- Redis restarted while a turn streams: the broker and the channel layer go
  away together. Input posted while it is down is accepted and runs once it
  is back; a session socket open across it, reconnecting with ?after=, gets
  every event once, in order.

After each: every invariant (invariants.py), and the figures in one line.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.chaos import harness
from tests.chaos.harness import Chaos, SocketWatcher, streamed, tool_then_final
from tests.stack import Outage

pytestmark = [pytest.mark.chaos]

# From the service's return to the turn's end, beyond the turn's own work.
RESUME_WITHIN = 8.0
PG_DOWN = 20.0
# After the 20 s outage: the drive retries every 2 s at most (runtime/drive.py),
# so one retry step, the step it may redo (a 1 s tool) and 2 s of slack.
RESUME_AFTER_OUTAGE = 5.0
STALLS: dict[str, Any] = {}  # the 20 s outage's figures, for the timing check below


def streaming_turn(chaos: Chaos, label: str, seconds: float = 3.0) -> tuple[str, str]:
    """A two-step turn whose first reply streams for `seconds`; waits for its first request."""
    sid = chaos.new_session()
    text = f"{label} {time.monotonic_ns()}"
    chaos.post(sid, text, tool_then_final(("debug.sleep", {"seconds": 1}), first=streamed(seconds)))
    harness.wait_until(lambda: chaos.model.requests(text), 20, "the model request", chaos.stack)
    return sid, text


def parked_turn(chaos: Chaos, label: str) -> tuple[str, str]:
    sid = chaos.new_session()
    text = f"{label} {time.monotonic_ns()}"
    chaos.post(sid, text, tool_then_final(("debug.charge", {"seconds": 0})))
    chaos.wait_kind(sid, "approval/requested", timeout=20)
    return sid, text


def approve_pending(chaos: Chaos, sid: str) -> float:
    call_id = next(e for e in chaos.events(sid) if e.kind == "approval/requested").data["call_id"]
    chaos.approve(sid, call_id)
    return time.time()


def requests_per_step(chaos: Chaos, sid: str, text: str) -> tuple[int, int]:
    steps = len({e.data["step"] for e in chaos.events(sid) if e.kind == "step/end"})
    return len(chaos.model.requests(text)), steps


@pytest.mark.timeout(180)
def test_postgres_restarted_mid_turn(chaos: Chaos) -> None:
    parked, _ = parked_turn(chaos, "parked across a pg restart")
    sid, text = streaming_turn(chaos, "streaming across a pg restart")
    time.sleep(chaos.rng.uniform(0.5, 1.5))
    outage: Outage = chaos.stack.postgres.restart(gap=0.0)
    approved_at = approve_pending(chaos, parked)

    ended = chaos.wait_kind(sid, "turn/end", timeout=60)
    parked_ended = chaos.wait_kind(parked, "turn/end", timeout=60)
    report = chaos.check([sid, parked])
    requests, steps = requests_per_step(chaos, sid, text)
    stall = ended - outage.up_at
    harness.summary(
        "postgres restart",
        down_s=outage.length,
        turn_end_after_up_s=stall,
        parked_resumed_s=parked_ended - approved_at,
        turns=report.turns,
        model_requests=requests,
        steps=steps,
        charges=harness.charges(chaos.stack, parked),
    )
    assert steps == 2 and requests <= steps + 1
    assert harness.charges(chaos.stack, parked) == 1
    assert stall < RESUME_WITHIN, f"turn/end {stall:.2f}s after PostgreSQL returned\n{chaos.stack.logs()}"


@pytest.mark.timeout(180)
def test_postgres_down_20s_mid_turn(chaos: Chaos) -> None:
    idle = chaos.new_session()
    sid, text = streaming_turn(chaos, "streaming across a 20 s pg outage", seconds=4.0)
    time.sleep(chaos.rng.uniform(0.5, 2.0))
    down_at = chaos.stack.postgres.stop()
    try:
        time.sleep(2.0)
        during = chaos.try_post(idle, f"posted while pg is down {time.monotonic_ns()}")
        time.sleep(max(0.0, down_at + PG_DOWN - time.time()))
    finally:
        up_at = chaos.stack.postgres.start()
    ended = chaos.wait_kind(sid, "turn/end", timeout=60)
    after = chaos.post(idle, f"posted after pg is back {time.monotonic_ns()}")
    after_ended = chaos.wait_kind(idle, "turn/end", timeout=60)
    report = chaos.check([sid, idle])
    requests, steps = requests_per_step(chaos, sid, text)
    stall = ended - up_at
    harness.summary(
        "postgres down 20s",
        down_s=up_at - down_at,
        turn_end_after_up_s=stall,
        post_during_outage=during,
        next_turn_s=after_ended - up_at,
        turns=report.turns,
        model_requests=requests,
        steps=steps,
    )
    assert during != 202, "nothing can be accepted without the log"
    assert after["disposition"] == "started"
    assert steps == 2 and requests <= steps + 1
    STALLS["pg_down_20s"] = stall
    STALLS["pg_down_20s_detail"] = (
        f"requests at {[round(t - up_at, 2) for t in chaos.model.requests(text)]}; "
        f"{harness.timeline(chaos.events(sid), up_at)}"
    )


def test_postgres_down_20s_the_turn_resumes_within_seconds_of_its_return() -> None:
    stall = STALLS.get("pg_down_20s")
    assert stall is not None, "test_postgres_down_20s_mid_turn did not run"
    assert stall < RESUME_AFTER_OUTAGE, (
        f"turn/end {stall:.2f}s after PostgreSQL returned; {STALLS['pg_down_20s_detail']}"
    )


@pytest.mark.timeout(180)
def test_redis_restarted_mid_turn(chaos: Chaos) -> None:
    watched = chaos.new_session()
    chaos.post(watched, f"before the redis restart {time.monotonic_ns()}")
    chaos.wait_kind(watched, "turn/end", timeout=30)
    socket = SocketWatcher(chaos.stack, watched).start()
    try:
        head = len(chaos.events(watched))
        harness.wait_until(lambda: socket.last() >= head, 15, "the socket's replay", chaos.stack)
        text = f"streaming across a redis restart {time.monotonic_ns()}"
        chaos.post(watched, text, tool_then_final(("debug.sleep", {"seconds": 1}), first=streamed(3.0)))
        harness.wait_until(lambda: chaos.model.requests(text), 20, "the model request", chaos.stack)
        other = chaos.new_session()
        time.sleep(chaos.rng.uniform(0.3, 1.0))
        down_at = chaos.stack.redis.stop()
        try:
            socket.drop()  # the client's connection drops too: it comes back with ?after=
            time.sleep(1.0)
            during = chaos.post(other, f"posted while redis is down {time.monotonic_ns()}")
        finally:
            up_at = chaos.stack.redis.start()
        ended = chaos.wait_kind(watched, "turn/end", count=2, timeout=60)
        other_ended = chaos.wait_kind(other, "turn/end", timeout=60)
        # The broker is back for new work, too.
        posted = time.time()
        chaos.post(watched, f"after the redis restart {time.monotonic_ns()}")
        last_ended = chaos.wait_kind(watched, "turn/end", count=3, timeout=60)
        report = chaos.check([watched, other])
        final = len(chaos.events(watched))
        harness.wait_until(lambda: socket.last() >= final, 20, "the socket to deliver every event", chaos.stack)
    finally:
        socket.stop()
    requests, steps = requests_per_step(chaos, watched, text)
    harness.summary(
        "redis restart",
        down_s=up_at - down_at,
        streaming_turn_end_after_up_s=ended - up_at,
        input_during_outage=during["disposition"],
        its_turn_end_after_up_s=other_ended - up_at,
        new_input_to_turn_end_s=last_ended - posted,
        socket_connects=socket.connects,
        socket_events=len(socket.seqs),
        gaps=len(socket.gaps),
        turns=report.turns,
        model_requests=requests,
        steps=steps,
    )
    assert socket.connects >= 2, "the socket reconnected"
    assert socket.seqs == list(range(1, final + 1)), f"every event once, in order: {socket.gaps}"
    assert len(chaos.model.requests(during_text(chaos, other))) == 1, "the input accepted during the outage ran once"
    assert steps == 2 and requests <= steps + 1
    assert other_ended - up_at < RESUME_WITHIN, f"{other_ended - up_at:.2f}s after Redis returned\n{chaos.stack.logs()}"


def during_text(chaos: Chaos, sid: str) -> str:
    return str(next(e for e in chaos.events(sid) if e.kind == "user/message").data["text"])
