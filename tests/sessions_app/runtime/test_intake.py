"""Bounded intake (issue 27.5): what one admission takes of the waiting lanes
is bounded in count and bytes; a flood is taken in over several admissions,
in arrival order, every input exactly once, and no admission holds more than
the bound in memory. Openings are made and closed here directly (no model):
the worker's end to end is tests/sessions_app/runtime/test_intake_worker.py."""

from __future__ import annotations

import re
import tracemalloc
from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.log.records import Fence
from sessions_app.models import Event, Session
from sessions_app.runtime import admission
from sessions_app.runtime.drive import drive
from sessions_app.services import inputs
from sessions_app.services.inputs import MAX_INPUT_CHARS
from tests.fakes.fake_llm import Reply
from tests.helpers import edit_profile, events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

FLOOD = 300
MIB = 1_048_576


def write(i: int, size: int = MAX_INPUT_CHARS) -> str:
    """A write of `size` characters that names itself at its start."""
    mark = f"<w{i:03d}>"
    return mark + "x" * (size - len(mark))


def flood(session: Session, n: int = FLOOD, *, lane: str = "passive", size: int = MAX_INPUT_CHARS) -> list[int]:
    # A backlog past the profile's bound on pending work (docs/storage.md), which these tests raise:
    # what they test is how openings take in whatever waits, however much that is.
    edit_profile(session.profile, max_waiting_inputs=10_000, max_waiting_bytes=64 * MIB, max_passive_inputs=10_000)
    return [services.inject(session.id, write(i, size), lane=lane).seq for i in range(n)]  # type: ignore[arg-type]


def busy(session: Session) -> None:
    """A turn is open (input queues behind it) until `idle`."""
    services.run_turn(session.id, "first")


def idle(session: Session) -> None:
    with log.locked(session.id) as tx:
        tx.append("turn/end", {"status": "completed"})


def open_and_close(session: Session) -> list[tuple[str, dict[str, Any]]]:
    """Open a turn for woken input (as a worker does), close it, and return
    what its opening took in (kind, data)."""
    with log.locked(session.id) as tx:
        start = admission.open_turn(tx, None, "")
        tx.append("turn/end", {"status": "completed"})
    rows = Event.objects.filter(session=session, seq__gt=start, kind__in=("user/message", "context/injected"))
    return list(rows.order_by("seq").values_list("kind", "data"))


def test_a_passive_flood_is_taken_in_over_bounded_openings_in_order_exactly_once(session: Session) -> None:
    busy(session)
    written = flood(session)
    follow = services.inject(session.id, "and now?", lane="follow_up").seq
    idle(session)
    taken: list[int] = []
    openings = 0
    while Session.objects.get(id=session.id).queued_follow_ups:
        took = open_and_close(session)
        openings += 1
        assert 1 <= len(took) <= 64
        assert sum(len(d["text"].encode()) for _, d in took) <= MIB
        taken += [d["source_seq"] for _, d in took]
        assert openings <= FLOOD  # each opening takes at least one: never a loop
    # 10 writes of 100,000 bytes fit 1 MiB (and the short follow-up fits beside the last ten).
    assert openings == 30
    assert taken == [*written, follow]  # in arrival order, none twice, none missing
    assert took[-1] == ("user/message", {"text": "and now?", "source_seq": follow, "lane": "follow_up"})
    row = Session.objects.get(id=session.id)
    assert (row.deferred_cursor, row.queued_follow_ups) == (follow, 0)


@pytest.mark.parametrize("lane", ["follow_up", None])
def test_input_on_an_idle_session_waits_behind_a_backlog_larger_than_one_take(
    session: Session, lane: str | None
) -> None:
    """New text reaching an idle session with more waiting than one opening
    takes is never answered ahead of it: it queues as a follow-up, and the
    backlog's turns reach it in arrival order (found from outside: the
    follow-up opened at once with ten of 300 writes, the rest unseen)."""
    written = flood(session, 25)
    receipt = services.inject(session.id, "and now?", lane=lane, wake=True)  # type: ignore[arg-type]
    assert (receipt.disposition, receipt.lane) == ("queued", "follow_up")
    assert not Event.objects.filter(session=session, kind="turn/start").exists()
    taken: list[int] = []
    while Session.objects.get(id=session.id).queued_follow_ups:
        taken += [d["source_seq"] for _, d in open_and_close(session)]
        assert len(taken) <= 26
    assert taken == [*written, receipt.seq]


def test_input_on_an_idle_session_opens_its_turn_when_the_backlog_fits_one_take(session: Session) -> None:
    written = flood(session, 3)
    receipt = services.inject(session.id, "and now?", wake=True)
    assert receipt.disposition == "started"
    took = Event.objects.filter(session=session, kind="context/injected").values_list("data", flat=True)
    assert [d["source_seq"] for d in took] == written


def test_a_turn_short_of_its_follow_up_opens_on_context_and_the_follow_up_stays_owed(
    session: Session, settings: Any
) -> None:
    settings.TERRET_INTAKE_MAX_ITEMS = 2
    busy(session)
    written = flood(session, 3, size=10)
    follow = services.inject(session.id, "then this", lane="follow_up").seq
    idle(session)
    first = open_and_close(session)
    assert [(k, d["source_seq"]) for k, d in first] == [("context/injected", s) for s in written[:2]]
    row = Session.objects.get(id=session.id)
    assert (row.deferred_cursor, row.queued_follow_ups, row.open_turn_seq) == (written[1], 1, None)
    assert row.queued_follow_ups == 1  # the sweep and has_work still see it owed
    second = open_and_close(session)
    assert [(k, d["source_seq"]) for k, d in second] == [("context/injected", written[2]), ("user/message", follow)]


def test_one_input_longer_than_the_byte_bound_still_goes_in_alone(session: Session, settings: Any) -> None:
    settings.TERRET_INTAKE_MAX_BYTES = 1000
    busy(session)
    written = flood(session, 3, size=5000)
    services.inject(session.id, "go", lane="follow_up")
    idle(session)
    sizes = [len(open_and_close(session)) for _ in range(4)]
    assert sizes == [1, 1, 1, 1]
    placed = Event.objects.filter(session=session, kind__in=("context/injected", "user/message"))
    placed = placed.filter(data__has_key="source_seq")
    assert [d["source_seq"] for d in placed.order_by("seq").values_list("data", flat=True)][:3] == written


def test_a_steer_flood_rides_the_turn_a_bounded_part_per_step(session: Session, settings: Any) -> None:
    settings.TERRET_INTAKE_MAX_ITEMS = 4
    busy(session)  # steers queue for the open turn
    written = flood(session, 10, lane="steer", size=20)
    row = Session.objects.get(id=session.id)
    drained: list[list[int]] = []
    more = True
    while more:
        head = Session.objects.get(id=session.id).last_seq
        more = admission.drain_inbox(session.id, Fence(row.lease_gen, 30.0))
        new = Event.objects.filter(session=session, seq__gt=head).order_by("seq").values_list("kind", "data")
        assert {k for k, _ in new} == {"context/injected"}
        drained.append([d["source_seq"] for _, d in new])
    assert [len(part) for part in drained] == [4, 4, 2]
    assert [s for part in drained for s in part] == written
    row = Session.objects.get(id=session.id)
    assert (row.inbox_seq, row.woken_steers) == (written[-1], 0)


def test_the_woken_steers_left_by_a_bounded_opening_stay_owed(session: Session, settings: Any) -> None:
    settings.TERRET_INTAKE_MAX_ITEMS = 2
    busy(session)
    written = flood(session, 3, lane="steer", size=20)
    idle(session)
    with log.locked(session.id) as tx:
        opened = admission.open_taking(tx, None, "")
    assert opened.steers_left
    took = Event.objects.filter(session=session, seq__gt=opened.seq, kind__in=("user/message", "context/injected"))
    assert [d["source_seq"] for d in took.order_by("seq").values_list("data", flat=True)] == written[:2]
    row = Session.objects.get(id=session.id)
    assert row.inbox_seq == written[1] and row.woken_steers > 0  # the sweep still finds the third owed
    assert admission.has_woken_input(session.id, row.inbox_seq)


def test_a_withdrawal_inside_a_bounded_take_is_skipped_and_the_cursor_stays_exact(
    session: Session, settings: Any
) -> None:
    settings.TERRET_INTAKE_MAX_ITEMS = 2
    busy(session)
    written = flood(session, 4, size=10)
    inputs.withdraw(session.id, written[1])
    services.inject(session.id, "go", lane="follow_up")
    idle(session)
    first = open_and_close(session)
    assert [d["source_seq"] for _, d in first] == [written[0], written[2]]
    assert Session.objects.get(id=session.id).deferred_cursor == written[2]
    second = open_and_close(session)
    assert [k for k, _ in second] == ["context/injected", "user/message"]
    assert second[0][1]["source_seq"] == written[3]
    assert len(events(session, "turn/start")) == 3


def test_opening_on_a_30_mb_backlog_holds_a_few_bounds_at_most(session: Session) -> None:
    busy(session)
    flood(session)
    services.inject(session.id, "and now?", lane="follow_up")
    idle(session)
    tracemalloc.start()
    try:
        with log.locked(session.id) as tx:
            tracemalloc.reset_peak()
            admission.open_turn(tx, None, "")
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MIB, f"opening on a 30 MB backlog peaked at {peak} bytes"
    assert Event.objects.filter(session=session, kind="context/injected").count() == 10


def test_a_running_turn_takes_a_steer_flood_one_bounded_part_a_step(
    session: Session, settings: Any, fake_llm: Any
) -> None:
    settings.TERRET_INTAKE_MAX_ITEMS = 4
    fake_llm.script(*[Reply(tool_calls=[("debug.noop", {})]) for _ in range(2)], Reply(text="done"))
    busy(session)
    flood(session, 10, lane="steer", size=20)
    assert drive(session.id) == "ended"
    firsts: dict[str, int] = {}
    for n, body in enumerate(fake_llm.requests):
        for found in re.findall(r"<w\d{3}>", str(body["messages"])):
            firsts.setdefault(found, n)
    assert [list(firsts.values()).count(n) for n in range(len(fake_llm.requests))] == [4, 4, 2]
    assert list(firsts) == [f"<w{i:03d}>" for i in range(10)]
    assert len(events(session, "turn/start")) == 1


def test_steers_an_opening_left_behind_ride_the_turns_next_steps(
    session: Session, settings: Any, fake_llm: Any
) -> None:
    settings.TERRET_INTAKE_MAX_ITEMS = 4
    fake_llm.script(*[Reply(tool_calls=[("debug.noop", {})]) for _ in range(2)], Reply(text="done"))
    busy(session)
    flood(session, 10, lane="steer", size=20)
    idle(session)  # the ten wait for a turn of their own: the worker's opening takes four
    assert drive(session.id) == "ended"
    firsts: dict[str, int] = {}
    for n, body in enumerate(fake_llm.requests):
        for found in re.findall(r"<w\d{3}>", str(body["messages"])):
            firsts.setdefault(found, n)
    assert [list(firsts.values()).count(n) for n in range(len(fake_llm.requests))] == [4, 4, 2]
    assert list(firsts) == [f"<w{i:03d}>" for i in range(10)]
    assert len(events(session, "turn/start")) == 2  # "first"'s, and the one turn for all ten
    assert Session.objects.get(id=session.id).woken_steers == 0
