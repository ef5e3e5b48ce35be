"""The process-wide deadline watchdog (llm/deadline.py)."""

from __future__ import annotations

import time

from sessions_app.llm import deadline
from sessions_app.llm.abort import CANCELLED, DEADLINE, Abort
from sessions_app.llm.types import ModelCancelled, ModelDeadline, ModelReply, Usage


def wait_for(abort: Abort, limit: float = 3.0) -> float:
    started = time.monotonic()
    assert abort.wait(limit), "the deadline never fired"
    return time.monotonic() - started


def test_deadlines_fire_in_order_and_on_time() -> None:
    aborts = {seconds: Abort() for seconds in (0.3, 0.1, 0.2)}
    fired: list[float] = []
    for seconds, abort in aborts.items():
        abort.bind(lambda seconds=seconds: fired.append(seconds))
        deadline.arm(abort, seconds)

    elapsed = wait_for(aborts[0.3])

    assert fired == [0.1, 0.2, 0.3]
    assert all(a.reason == DEADLINE for a in aborts.values())
    assert elapsed < 0.5


def test_an_earlier_deadline_armed_later_wakes_the_watchdog() -> None:
    late, soon = Abort(), Abort()
    disarm_late = deadline.arm(late, 30)
    deadline.arm(soon, 0.1)
    try:
        assert wait_for(soon) < 0.4
        assert not late.is_set()
    finally:
        disarm_late()


def test_a_disarmed_deadline_never_fires() -> None:
    abort = Abort()
    disarm = deadline.arm(abort, 0.1)
    disarm()
    disarm()  # idempotent
    assert not abort.wait(0.3)


def test_a_cancel_keeps_its_reason_when_the_deadline_passes() -> None:
    abort = Abort()
    abort.set(CANCELLED)
    deadline.arm(abort, 0.05)
    time.sleep(0.15)
    assert abort.reason == CANCELLED


def test_dead_entries_are_compacted() -> None:
    before = deadline.pending()
    disarms = [deadline.arm(Abort(), 60) for _ in range(2000)]
    assert deadline.pending() == before + 2000
    for disarm in disarms:
        disarm()
    assert deadline.pending() == before
    assert len(deadline._WATCHDOG._heap) < 1000  # not 2000 dead entries waiting a minute


def test_a_failing_hook_does_not_stop_the_watchdog() -> None:
    broken, fine = Abort(), Abort()
    broken.bind(lambda: 1 / 0)
    deadline.arm(broken, 0.05)
    deadline.arm(fine, 0.1)
    assert wait_for(fine) < 0.5
    assert deadline.watchdog_threads() == 1


def test_stop_error_says_why() -> None:
    partial = ModelReply(content="half", usage=Usage(1, 2, None))
    cancelled, expired = Abort(), Abort()
    cancelled.set(CANCELLED)
    expired.set(DEADLINE)

    error = deadline.stop_error(cancelled, "m", partial)
    assert isinstance(error, ModelCancelled) and error.partial is partial and not error.transient

    late = deadline.stop_error(expired, "m", partial, 300)
    assert isinstance(late, ModelDeadline) and late.transient
    assert "300s" in str(late)
