"""Input lanes and dispositions, driven in-process (TERRET_WORKER=manual):
steer rides the running turn, a follow-up gets a turn of its own after it, a
passive write starts nothing and is seen by the next turn; withdrawal, the
multitask strategies, the order across lanes, and every receipt disposition.
Model requests are counted at the fake server."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.errors import InputConsumed, InvalidInput, TurnAlreadyRunning, UnknownInput
from sessions_app.models import Event, Session
from sessions_app.runtime import sweep
from sessions_app.runtime.drive import drive
from sessions_app.services import inputs
from tests.fakes.fake_llm import Reply
from tests.helpers import events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


def turns(session: Session) -> list[list[tuple[str, str]]]:
    """Each turn's model-visible input, as (kind, text) in seq order."""
    out: list[list[tuple[str, str]]] = []
    for kind, data in Event.objects.filter(session=session).order_by("seq").values_list("kind", "data"):
        if kind == "turn/start":
            out.append([])
        elif kind in ("user/message", "context/injected") and out:
            out[-1].append((kind, data["text"]))
    return out


def count(session: Session) -> int:
    return Event.objects.filter(session=session).count()


def busy(session: Session) -> int:
    """A turn opened and not yet driven: the session is mid-turn."""
    return services.run_turn(session.id, "first")


def test_a_steer_rides_the_running_turn_and_is_answered_with_it(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"))
    busy(session)
    r = inputs.inject(session.id, "also this", lane="steer")
    assert (r.disposition, r.lane) == ("queued", "steer")
    assert inputs.receipt(session.id, r.seq).disposition == "queued"
    assert drive(session.id) == "ended"
    assert turns(session) == [[("user/message", "first"), ("context/injected", "also this")]]
    got = inputs.receipt(session.id, r.seq)
    assert got.disposition == "answered"
    assert got.placed_seq is not None and got.answered_seq is not None and got.placed_seq < got.answered_seq
    assert len(fake_llm.requests) == 1


def test_a_follow_up_waits_for_the_turn_and_opens_its_own(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    first = busy(session)
    r = inputs.inject(session.id, "after that", lane="follow_up")
    assert r.disposition == "queued"
    assert Session.objects.get(id=session.id).queued_follow_ups == 1
    assert drive(session.id) == "ended"
    assert turns(session) == [[("user/message", "first")], [("user/message", "after that")]]
    assert len(fake_llm.requests) == 2
    # The first request did not carry the follow-up; the second did.
    assert "after that" not in str(fake_llm.requests[0]["messages"])
    assert "after that" in str(fake_llm.requests[1]["messages"])
    got = inputs.receipt(session.id, r.seq)
    ends = Event.objects.filter(session=session, kind="turn/end").order_by("seq").values_list("seq", flat=True)
    assert (got.disposition, got.answered_seq) == ("answered", list(ends)[1])
    assert got.turn_seq is not None and got.turn_seq > first
    assert Session.objects.get(id=session.id).queued_follow_ups == 0


def test_a_follow_up_on_an_idle_session_starts_at_once(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"))
    r = inputs.inject(session.id, "now", lane="follow_up")
    assert r.disposition == "started"
    assert drive(session.id) == "ended"
    assert inputs.receipt(session.id, r.seq).disposition == "answered"


def test_a_passive_write_starts_nothing_and_the_next_turn_sees_it(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    busy(session)
    p = inputs.inject(session.id, "evidence: disk at 91%", lane="passive")
    assert drive(session.id) == "ended"
    assert turns(session) == [[("user/message", "first")]], "not taken into the running turn"
    assert inputs.receipt(session.id, p.seq).disposition == "queued"
    # On an idle session too: nothing starts.
    q = inputs.inject(session.id, "evidence: load 3.2", lane="passive")
    assert q.disposition == "queued"
    assert drive(session.id) == "idle"
    assert len(fake_llm.requests) == 1
    inputs.inject(session.id, "what do you see?")
    assert drive(session.id) == "ended"
    assert turns(session)[1] == [
        ("context/injected", "evidence: disk at 91%"),
        ("context/injected", "evidence: load 3.2"),
        ("user/message", "what do you see?"),
    ]
    assert inputs.receipt(session.id, p.seq).disposition == "answered"


def test_withdraw_a_queued_follow_up(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"))
    busy(session)
    r = inputs.inject(session.id, "never mind", lane="follow_up")
    before = count(session)
    w = inputs.withdraw(session.id, r.seq, by="owner")
    assert w.disposition == "withdrawn"
    assert count(session) == before + 1
    assert events(session, "input/withdrawn")[-1]["by"] == "owner"
    again = inputs.withdraw(session.id, r.seq, by="owner")
    assert again.replayed and count(session) == before + 1, "a second withdrawal appends nothing"
    row = Session.objects.get(id=session.id)
    assert row.queued_follow_ups == 0 and row.deferred_cursor >= r.seq
    assert drive(session.id) == "ended"
    assert len(turns(session)) == 1 and len(fake_llm.requests) == 1
    assert inputs.receipt(session.id, r.seq).disposition == "withdrawn"


def test_a_consumed_input_cannot_be_withdrawn(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"))
    busy(session)
    r = inputs.inject(session.id, "steer", lane="steer")
    assert drive(session.id) == "ended"
    before = count(session)
    with pytest.raises(InputConsumed, match="taken into the transcript at seq"):
        inputs.withdraw(session.id, r.seq)
    first = Event.objects.filter(session=session, kind="user/message").order_by("seq").values_list("seq", flat=True)[0]
    with pytest.raises(InputConsumed, match="opened its turn"):
        inputs.withdraw(session.id, first)
    with pytest.raises(UnknownInput):
        inputs.withdraw(session.id, 1)  # agent/spawned: not an input
    assert count(session) == before


def test_withdrawing_the_last_steer_moves_the_inbox_cursor(session: Session) -> None:
    busy(session)
    a = inputs.inject(session.id, "a", lane="steer")
    b = inputs.inject(session.id, "b", lane="steer")
    inputs.withdraw(session.id, b.seq)
    row = Session.objects.get(id=session.id)
    assert row.inbox_seq < a.seq, "a still waits: the cursor may not pass it"
    inputs.withdraw(session.id, a.seq)
    row = Session.objects.get(id=session.id)
    assert row.inbox_seq >= b.seq and row.last_input_seq <= row.inbox_seq


def test_reject_refuses_while_busy_and_changes_nothing(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    busy(session)
    before = count(session)
    with pytest.raises(TurnAlreadyRunning):
        inputs.inject(session.id, "x", multitask_strategy="reject")
    assert count(session) == before
    assert drive(session.id) == "ended"
    r = inputs.inject(session.id, "y", multitask_strategy="reject")
    assert r.disposition == "started"


def test_enqueue_is_a_follow_up(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    busy(session)
    r = inputs.inject(session.id, "queued run", multitask_strategy="enqueue")
    assert (r.disposition, r.lane) == ("queued", "follow_up")
    assert drive(session.id) == "ended"
    assert turns(session)[1] == [("user/message", "queued run")]


def test_interrupt_cancels_the_running_turn_and_starts_the_next(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="two"))
    busy(session)
    r = inputs.inject(session.id, "instead", multitask_strategy="interrupt")
    assert r.disposition == "queued"
    # No worker held the first turn, so it was closed here, cancelled.
    assert [e["status"] for e in events(session, "turn/end")] == ["cancelled"]
    assert drive(session.id) == "ended"
    assert [e["status"] for e in events(session, "turn/end")] == ["cancelled", "completed"]
    assert turns(session)[1] == [("user/message", "instead")]
    assert len(fake_llm.requests) == 1, "the cancelled turn made no request"


def test_the_order_across_lanes(fake_llm: Any, session: Session) -> None:
    """Steers ride the running turn in arrival order; then one turn per
    follow-up, in arrival order, each taking in the passive writes that
    arrived before it."""
    fake_llm.script(Reply(text="1"), Reply(text="2"), Reply(text="3"))
    busy(session)
    inputs.inject(session.id, "A", lane="follow_up")
    inputs.inject(session.id, "s1", lane="steer")
    inputs.inject(session.id, "p", lane="passive")
    inputs.inject(session.id, "B", lane="follow_up")
    inputs.inject(session.id, "s2", lane="steer")
    assert drive(session.id) == "ended"
    assert turns(session) == [
        [("user/message", "first"), ("context/injected", "s1"), ("context/injected", "s2")],
        [("user/message", "A")],
        [("context/injected", "p"), ("user/message", "B")],
    ]
    assert len(fake_llm.requests) == 3


def test_control_is_served_while_follow_ups_wait(fake_llm: Any, session: Session) -> None:
    busy(session)
    inputs.inject(session.id, "later", lane="follow_up")
    assert inputs.cancel(session.id, by="owner") is True
    assert [e["status"] for e in events(session, "turn/end")] == ["cancelled"]
    # The follow-up is owed a turn nobody opened: the sweep finds it.
    assert str(session.id) in sweep.owed()
    fake_llm.script(Reply(text="ok"))
    assert drive(session.id) == "ended"
    assert turns(session)[1] == [("user/message", "later")]


def test_bad_lanes_are_refused(session: Session) -> None:
    before = count(session)
    for kwargs in (
        {"lane": "sideways"},
        {"multitask_strategy": "rollback"},
        {"lane": "passive", "multitask_strategy": "enqueue"},
        {"lane": "steer", "multitask_strategy": "interrupt"},
    ):
        with pytest.raises(InvalidInput):
            inputs.inject(session.id, "x", **kwargs)  # type: ignore[arg-type]
    assert count(session) == before


def test_an_idempotent_follow_up_replays_its_receipt(session: Session) -> None:
    busy(session)
    a = inputs.inject(session.id, "once", lane="follow_up", idempotency_key="k1")
    b = inputs.inject(session.id, "once", lane="follow_up", idempotency_key="k1")
    assert b.replayed and b.seq == a.seq
    assert Session.objects.get(id=session.id).queued_follow_ups == 1


def test_started_input_reads_placed_until_its_turn_ends(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one"))
    r = inputs.inject(session.id, "hello")
    assert r.disposition == "started"
    got = inputs.receipt(session.id, r.seq)
    assert (got.disposition, got.placed_seq, got.answered_seq) == ("placed", r.seq, None)
    assert drive(session.id) == "ended"
    assert inputs.receipt(session.id, r.seq).disposition == "answered"


def test_input_a_budget_holds_reads_held_and_can_be_withdrawn(session: Session) -> None:
    from sessions_app.services.budgets import set_budget

    set_budget(session.id, {"cost_usd": None, "tokens": None, "steps": None, "turns": 0}, by="owner")
    r = inputs.inject(session.id, "wait for it")
    assert r.disposition == "held"
    assert inputs.receipt(session.id, r.seq).disposition == "held"
    assert Session.objects.get(id=session.id).held_seq is not None
    inputs.withdraw(session.id, r.seq, by="owner")
    row = Session.objects.get(id=session.id)
    assert row.held_seq is None and row.last_input_seq <= row.inbox_seq, "nothing left held or pending"
    assert inputs.receipt(session.id, r.seq).disposition == "withdrawn"


def woken(session: Session) -> int:
    return Session.objects.values_list("woken_steers", flat=True).get(id=session.id)


def test_a_woken_steer_left_by_a_turn_that_ended_is_owed_a_turn(fake_llm: Any, session: Session) -> None:
    """A steer that arrived as the turn ended, and the worker died before
    opening the next turn: its wake-up was spent while the lease was busy, so
    only the sweep can find it (Session.woken_steers, sweep.owed)."""
    busy(session)
    steer = inputs.inject(session.id, "also this", lane="steer")
    assert woken(session) == 1
    assert inputs.cancel(session.id, by="owner") is True  # the turn ends without taking the steer in
    assert [e["status"] for e in events(session, "turn/end")] == ["cancelled"]
    assert str(session.id) in sweep.owed()
    fake_llm.script(Reply(text="ok"))
    assert drive(session.id) == "ended"
    assert turns(session)[1] == [("user/message", "also this")]
    assert inputs.receipt(session.id, steer.seq).disposition == "answered"
    assert woken(session) == 0
    assert str(session.id) not in sweep.owed()
    assert len(fake_llm.requests) == 1


def test_placed_and_withdrawn_steers_leave_nothing_owed(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="1"))
    busy(session)
    inputs.inject(session.id, "rides along", lane="steer")
    assert drive(session.id) == "ended"  # placed as context/injected at the step boundary
    assert turns(session)[0] == [("user/message", "first"), ("context/injected", "rides along")]
    assert woken(session) == 0
    busy(session)
    taken_back = inputs.inject(session.id, "never mind", lane="steer")
    assert woken(session) == 1
    inputs.withdraw(session.id, taken_back.seq, by="owner")
    assert woken(session) == 0
    assert inputs.cancel(session.id, by="owner") is True
    assert str(session.id) not in sweep.owed()


def waiting_follow_ups(session: Session, *texts: str) -> list[int]:
    """A turn that ended (cancelled, no worker held it) with follow-ups left
    waiting for the turns nobody has opened yet: the moment a worker races."""
    busy(session)
    seqs = [inputs.inject(session.id, text, lane="follow_up").seq for text in texts]
    assert inputs.cancel(session.id, by="owner") is True
    row = Session.objects.get(id=session.id)
    assert row.open_turn_seq is None and row.queued_follow_ups == len(texts)
    return seqs


def answered_by_own_turn(session: Session, seq: int) -> None:
    """The receipt is answered, by the end of the turn that placed it (no other turn/start in between)."""
    got = inputs.receipt(session.id, seq)
    assert got.disposition == "answered" and got.turn_seq is not None and got.answered_seq is not None
    between = Event.objects.filter(session=session, seq__gt=got.turn_seq, seq__lt=got.answered_seq)
    assert not between.filter(kind__in=("turn/start", "turn/end")).exists()
    assert got.turn_seq < (got.placed_seq or 0) < got.answered_seq


def test_input_on_an_idle_session_queues_behind_waiting_follow_ups(fake_llm: Any, session: Session) -> None:
    """Each follow-up opens its own turn, in arrival order; input that arrives
    while they wait never opens a turn that would fold them in as context:
    a follow-up (or an interrupt, or enqueue) queues behind them, a steer
    rides the next turn."""
    fake_llm.script(*[Reply(text=str(i)) for i in range(5)])
    f1, f2 = waiting_follow_ups(session, "F1", "F2")
    steer = inputs.inject(session.id, "S")
    f3 = inputs.inject(session.id, "F3", lane="follow_up")
    cut = inputs.inject(session.id, "I", multitask_strategy="interrupt")
    queued = inputs.inject(session.id, "E", multitask_strategy="enqueue")
    assert [r.disposition for r in (steer, f3, cut, queued)] == ["queued"] * 4
    assert [r.lane for r in (f3, cut, queued)] == ["follow_up"] * 3
    with pytest.raises(TurnAlreadyRunning):  # the session is not idle for reject: turns are owed
        inputs.inject(session.id, "R", multitask_strategy="reject")
    assert Event.objects.filter(session=session, kind="turn/start").count() == 1
    assert drive(session.id) == "ended"
    assert turns(session)[1:] == [
        [("user/message", "F1"), ("context/injected", "S")],
        [("user/message", "F2")],
        [("user/message", "F3")],
        [("user/message", "I")],
        [("user/message", "E")],
    ]
    for seq in (f1, f2, steer.seq, f3.seq, cut.seq, queued.seq):
        answered_by_own_turn(session, seq)
    assert len(fake_llm.requests) == 5


def test_a_follow_up_behind_a_woken_steer_is_its_turns_message(fake_llm: Any, session: Session) -> None:
    """A woken steer left waiting before a follow-up rides the follow-up's
    turn as context: the follow-up is the turn's message, never context."""
    fake_llm.script(Reply(text="1"))
    busy(session)
    inputs.inject(session.id, "S", lane="steer")
    follow = inputs.inject(session.id, "F", lane="follow_up")
    assert inputs.cancel(session.id, by="owner") is True  # the turn ends taking in neither
    assert drive(session.id) == "ended"
    assert turns(session)[1:] == [[("context/injected", "S"), ("user/message", "F")]]
    answered_by_own_turn(session, follow.seq)


def test_a_drive_that_finds_a_turn_opened_since_its_claim_opens_none(fake_llm: Any, session: Session) -> None:
    """The race of issue 27: a worker claims the lease for a waiting
    follow-up; admission (no lease needed) opens a turn meanwhile. The
    drive's turn/start is refused under the row lock, it opens nothing, and
    the next round drives the open turn; the follow-up gets its own after."""
    from sessions_app.runtime import lease as leases
    from sessions_app.runtime.drive import _drive_with_lease

    fake_llm.script(Reply(text="1"), Reply(text="2"))
    (follow,) = waiting_follow_ups(session, "F")
    lease = leases.claim(session.id)
    assert lease is not None and lease.workload.queued_follow_ups == 1
    # Admission's own two events, as its guarded statement writes them (whatever
    # path opened it, the drive must not open a second turn over it).
    started = log.append_many(session.id, [("turn/start", {}), ("user/message", {"text": "typed meanwhile"})])[0].seq
    outcome, runner = _drive_with_lease(session.id, lease)
    assert (outcome, runner) == ("idle", None)
    leases.release(lease)
    assert Event.objects.filter(session=session, kind="turn/start").count() == 2  # the first, and run_turn's
    assert drive(session.id) == "ended"
    assert turns(session)[1:] == [[("user/message", "typed meanwhile")], [("user/message", "F")]]
    assert Event.objects.filter(session=session, kind="turn/start", seq__gt=started).count() == 1
    answered_by_own_turn(session, follow)
