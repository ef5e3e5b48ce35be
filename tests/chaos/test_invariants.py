"""The chaos checks themselves (invariants.py) catch what they claim to, on
logs written by hand: a check that passed everything would make every drill
green. No service needed: these run in `make test`, not only `make chaos`."""

from __future__ import annotations

from typing import Any

from tests.chaos.invariants import Ev, input_problems, lane_problems, log_problems, receipt_problems


def log(*entries: tuple[str, dict[str, Any]]) -> list[Ev]:
    return [Ev(seq, kind, data, float(seq)) for seq, (kind, data) in enumerate(entries, start=1)]


CALL = {"tool_calls": [{"id": "c1", "name": "debug.noop", "arguments": "{}"}]}
WHOLE = log(
    ("turn/start", {}),
    ("user/message", {"text": "hi"}),
    ("step/start", {"step": 1, "model": "m"}),
    ("assistant/message", CALL),
    ("approval/requested", {"call_id": "c1", "name": "debug.noop", "args": {}}),
    ("approval/resolved", {"call_id": "c1", "verdict": "approve"}),
    ("tool/result", {"call_id": "c1", "name": "debug.noop", "content": "ok"}),
    ("step/end", {"step": 1}),
    ("input/queued", {"text": "more", "wake": True}),
    ("context/injected", {"text": "more", "source_seq": 9}),
    ("turn/end", {"status": "completed"}),
)
RECEIPTS = [
    {"disposition": "started", "seq": 2, "turn_seq": 1},
    {"disposition": "queued", "seq": 9, "turn_seq": 1},
]


def without(events: list[Ev], kind: str) -> list[Ev]:
    """The log with the first event of `kind` removed, renumbered (so only that is wrong)."""
    kept = [e for i, e in enumerate(events) if not (e.kind == kind and kind not in [x.kind for x in events[:i]])]
    return [Ev(n, e.kind, e.data, e.at) for n, e in enumerate(kept, start=1)]


def test_a_whole_log_passes() -> None:
    assert log_problems(WHOLE) == []
    assert input_problems(WHOLE, RECEIPTS) == []


def test_a_gap_in_the_seqs_is_caught() -> None:
    holed = [e for e in WHOLE if e.seq != 3]
    assert any("gapless" in p for p in log_problems(holed))


def test_a_turn_without_its_end_or_with_two_starts_is_caught() -> None:
    assert any("never ended" in p for p in log_problems(WHOLE[:-1]))
    twice = log(("turn/start", {}), ("turn/start", {}), ("turn/end", {"status": "completed"}))
    assert any("while the turn" in p for p in log_problems(twice))
    assert any("no open turn" in p for p in log_problems(log(("turn/end", {"status": "completed"}))))


def test_a_closed_turn_owing_a_result_is_caught() -> None:
    assert any("owing a result for c1" in p for p in log_problems(without(WHOLE, "tool/result")))


def test_a_verdict_outside_its_turn_or_never_asked_is_caught() -> None:
    unasked = without(WHOLE, "approval/requested")
    assert any("never asked" in p for p in log_problems(unasked))
    late = [*WHOLE, Ev(12, "approval/resolved", {"call_id": "c1", "verdict": "approve"}, 12.0)]
    assert any("outside any turn" in p for p in log_problems(late))


def test_a_step_ended_twice_is_caught() -> None:
    doubled = [*WHOLE[:8], Ev(9, "step/end", {"step": 1}, 9.0)]
    doubled += [Ev(e.seq + 1, e.kind, e.data, e.at) for e in WHOLE[8:]]
    doubled = [Ev(e.seq, e.kind, {**e.data, "source_seq": 10} if e.kind == "context/injected" else e.data, e.at)
               for e in doubled]  # fmt: skip
    assert any("ended 2 times" in p for p in log_problems(doubled))


def test_accepted_input_that_was_never_taken_in_is_caught() -> None:
    dropped = without(WHOLE, "context/injected")
    receipts = [RECEIPTS[0], {"disposition": "queued", "seq": 9, "turn_seq": 1}]
    assert any("never taken in" in p for p in input_problems(dropped, receipts))
    assert any("has not ended" in p for p in input_problems(WHOLE[:-1], RECEIPTS))


def test_held_input_counts_as_visible() -> None:
    held = [*WHOLE, Ev(12, "input/queued", {"text": "x", "wake": True}, 12.0)]
    held.append(Ev(13, "input/held", {"source_seq": 12, "reason": {}}, 13.0))
    assert input_problems(held, [*RECEIPTS, {"disposition": "held", "seq": 12, "turn_seq": None}]) == []


FOLLOW_UPS = log(
    ("turn/start", {}),
    ("user/message", {"text": "hi"}),
    ("input/deferred", {"text": "A", "lane": "follow_up"}),
    ("input/deferred", {"text": "B", "lane": "follow_up"}),
    ("turn/end", {"status": "completed"}),
    ("turn/start", {}),
    ("user/message", {"text": "A", "source_seq": 3, "lane": "follow_up"}),
    ("turn/end", {"status": "completed"}),
    ("turn/start", {}),
    ("user/message", {"text": "B", "source_seq": 4, "lane": "follow_up"}),
    ("turn/end", {"status": "completed"}),
)


def test_follow_ups_each_in_a_turn_of_their_own_pass() -> None:
    assert lane_problems(FOLLOW_UPS) == []


def test_a_follow_up_folded_as_context_or_batched_or_out_of_order_is_caught() -> None:
    folded = [*FOLLOW_UPS[:4], Ev(5, "context/injected", {"text": "A", "source_seq": 3, "lane": "follow_up"}, 5.0)]
    assert any("folded into the turn of 1" in p for p in lane_problems(folded))
    batched = [*FOLLOW_UPS[:7], Ev(8, "user/message", {"text": "B", "source_seq": 4}, 8.0)]
    assert any("took in 2 follow-ups" in p for p in lane_problems(batched))
    swapped = [
        Ev(
            e.seq,
            e.kind,
            {**e.data, "source_seq": 7 - e.data["source_seq"]} if "source_seq" in e.data else e.data,
            e.at,
        )
        for e in FOLLOW_UPS
    ]
    assert any("out of arrival order" in p for p in lane_problems(swapped))


def test_receipts_true_of_the_log_pass() -> None:
    receipts = [
        {"disposition": "answered", "seq": 2, "turn_seq": 1, "placed_seq": 2, "answered_seq": 5},
        {"disposition": "answered", "seq": 3, "turn_seq": 6, "placed_seq": 7, "answered_seq": 8},
        {"disposition": "answered", "seq": 4, "turn_seq": 9, "placed_seq": 10, "answered_seq": 11},
    ]
    assert receipt_problems(FOLLOW_UPS, receipts) == []
    assert receipt_problems(FOLLOW_UPS[:9], [{"disposition": "queued", "seq": 4, "turn_seq": None}]) == []


def test_a_receipt_answered_by_another_turns_end_is_caught() -> None:
    """Issue 27's stranded input: its receipt said answered, by the end of a
    turn that was not the one that placed it (a second turn/start opened over it)."""
    stranded = log(
        ("turn/start", {}),
        ("input/deferred", {"text": "A", "lane": "follow_up"}),
        ("turn/start", {}),
        ("user/message", {"text": "A", "source_seq": 2, "lane": "follow_up"}),
        ("turn/end", {"status": "completed"}),
    )
    receipt = {"disposition": "answered", "seq": 2, "turn_seq": 1, "placed_seq": 4, "answered_seq": 5}
    assert any("while the turn of 1 is open" in p for p in log_problems(stranded))
    assert any("receipt says answered" in p for p in receipt_problems(stranded, [receipt]))
    early = {"disposition": "answered", "seq": 3, "turn_seq": 6, "placed_seq": 7, "answered_seq": 8}
    assert any("receipt says answered" in p for p in receipt_problems(FOLLOW_UPS[:7], [early]))
    assert any("receipt says queued" in p for p in receipt_problems(FOLLOW_UPS, [{"disposition": "queued", "seq": 3}]))
