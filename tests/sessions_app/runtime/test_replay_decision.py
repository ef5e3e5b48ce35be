"""The effect ledger's replay decision, as pure functions (runtime/effects.py).

`next_move(ledger, defn)` over every state a call's ledger can be in, for
each replay policy (safe, reconcile, never); `reconciled` over each answer
of a target; `stricter` where the policy recorded at the attempt and the
tool's policy now differ; `left_unknown` for a turn closing around an
attempt. The ledgers are parsed from log events by `effects.ledgers`, as the
runner parses them. No database: what the runner then does with a move is
tested end to end in test_effects.py and test_effects_kill.py."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.log.records import LoggedEvent
from sessions_app.runtime import effects
from sessions_app.runtime.effects import (
    NOT_REPLAYABLE,
    TARGET_CANNOT_TELL,
    AwaitOperator,
    CallLedger,
    Move,
    Reconcile,
    Run,
    Settled,
)
from sessions_app.tools.base import Definition, Reconciliation, Replay, ToolContext

CALL = "c1"
MESSAGE_SEQ = 10


def _looks(ctx: ToolContext, args: dict[str, Any]) -> Reconciliation:
    return Reconciliation("done", "found")  # never called: the decision does not ask the target


def tool(replay: Replay, *, hook: bool | None = None) -> Definition:
    """A tool declaring `replay`; a reconcile hook when it is `reconcile` (or `hook`)."""
    with_hook = replay == "reconcile" if hook is None else hook
    return Definition("t.effect", "a tool with an effect", {}, lambda ctx, args: "ok", mutating=True,
                      idempotent=False, replay=replay, reconcile=_looks if with_hook else None)  # fmt: skip


# -- ledgers, built from the events the runner and the operators append


def attempt(number: int, replay: str, why: str = "") -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {"call_id": CALL, "name": "t.effect", "attempt": number, "replay": replay}
    if why:
        data["replaces"], data["why"] = number - 1, why
    return "tool/attempt", data


def result(number: int, *, is_error: bool = False) -> tuple[str, dict[str, Any]]:
    return "tool/result", {"call_id": CALL, "name": "t.effect", "content": "r", "is_error": is_error, "attempt": number}


def unknown(number: int) -> tuple[str, dict[str, Any]]:
    return "tool/unknown", {"call_id": CALL, "name": "t.effect", "attempt": number, "reason": "worker died"}


def resolved(number: int, action: str, text: str = "") -> tuple[str, dict[str, Any]]:
    data = {"call_id": CALL, "attempt": number, "action": action, "by": "alice"}
    if text:
        data["result"] = text
    return "tool/resolved", data


def ledger_of(entries: list[tuple[str, dict[str, Any]]]) -> CallLedger | None:
    message = {"content": None, "tool_calls": [{"id": CALL, "name": "t.effect", "arguments": "{}"}]}
    events = [LoggedEvent(MESSAGE_SEQ, "assistant/message", message)]
    events += [LoggedEvent(MESSAGE_SEQ + i, kind, data) for i, (kind, data) in enumerate(entries, 1)]
    return effects.ledgers(events, after=MESSAGE_SEQ).get(CALL)


# Each ledger state by name: the events after the call's message, and the
# state of its last attempt (None: no attempt). Built per policy: the
# attempts record the policy they were admitted under.
def states(p: str) -> dict[str, tuple[list[tuple[str, dict[str, Any]]], str | None]]:
    return {
        "never attempted": ([], None),
        "in flight": ([attempt(1, p)], "in_flight"),
        "done": ([attempt(1, p), result(1)], "done"),
        "failed": ([attempt(1, p), result(1, is_error=True)], "failed"),
        "unknown": ([attempt(1, p), unknown(1)], "unknown"),
        "resolved rerun": ([attempt(1, p), unknown(1), resolved(1, "rerun")], "resolved"),
        "resolved done": ([attempt(1, p), unknown(1), resolved(1, "done", "refunded")], "resolved"),
        "resolved done, no text": ([attempt(1, p), unknown(1), resolved(1, "done")], "resolved"),
        "resolved failed": ([attempt(1, p), unknown(1), resolved(1, "failed", "card declined")], "resolved"),
        "resolved failed, no text": ([attempt(1, p), unknown(1), resolved(1, "failed")], "resolved"),
        # A re-run in flight again: its predecessor is superseded, the re-run decides.
        "superseded, re-run in flight": ([attempt(1, p), attempt(2, p, "safe")], "in_flight"),
        "superseded, re-run done": ([attempt(1, p), attempt(2, p, "safe"), result(2)], "done"),
    }


OPERATOR_DONE = Settled(1, "operator", "refunded")
OPERATOR_DONE_BARE = Settled(1, "operator", "done (marked done by an operator)")
OPERATOR_FAILED = Settled(1, "operator", "failed: marked failed by an operator (alice): card declined", True)
OPERATOR_FAILED_BARE = Settled(1, "operator", "failed: marked failed by an operator (alice)", True)

# Every state under every policy. Only an attempt in flight (no outcome, not
# marked) depends on the policy; everything else the log already settled.
EXPECTED: dict[str, dict[Replay, Move]] = {
    "never attempted": {"safe": Run(1), "reconcile": Run(1), "never": Run(1)},
    "in flight": {
        "safe": Run(2, 1, "safe"),
        "reconcile": Reconcile(1),
        "never": AwaitOperator(1, NOT_REPLAYABLE),
    },
    "done": {"safe": Settled(1), "reconcile": Settled(1), "never": Settled(1)},
    "failed": {"safe": Settled(1), "reconcile": Settled(1), "never": Settled(1)},
    "unknown": {"safe": AwaitOperator(1), "reconcile": AwaitOperator(1), "never": AwaitOperator(1)},
    "resolved rerun": {"safe": Run(2, 1, "rerun"), "reconcile": Run(2, 1, "rerun"), "never": Run(2, 1, "rerun")},
    "resolved done": {"safe": OPERATOR_DONE, "reconcile": OPERATOR_DONE, "never": OPERATOR_DONE},
    "resolved done, no text": {
        "safe": OPERATOR_DONE_BARE,
        "reconcile": OPERATOR_DONE_BARE,
        "never": OPERATOR_DONE_BARE,
    },
    "resolved failed": {"safe": OPERATOR_FAILED, "reconcile": OPERATOR_FAILED, "never": OPERATOR_FAILED},
    "resolved failed, no text": {
        "safe": OPERATOR_FAILED_BARE,
        "reconcile": OPERATOR_FAILED_BARE,
        "never": OPERATOR_FAILED_BARE,
    },
    "superseded, re-run in flight": {
        "safe": Run(3, 2, "safe"),
        "reconcile": Reconcile(2),
        "never": AwaitOperator(2, NOT_REPLAYABLE),
    },
    "superseded, re-run done": {"safe": Settled(2), "reconcile": Settled(2), "never": Settled(2)},
}

CASES = [(name, policy, move) for name, by_policy in EXPECTED.items() for policy, move in by_policy.items()]


def test_the_table_covers_every_state_under_every_policy() -> None:
    assert set(EXPECTED) == set(states("safe"))
    assert all(set(by_policy) == {"safe", "reconcile", "never"} for by_policy in EXPECTED.values())
    assert len(CASES) == 12 * 3


@pytest.mark.parametrize(("state", "policy", "move"), CASES, ids=[f"{s}-{p}" for s, p, _ in CASES])
def test_next_move(state: str, policy: Replay, move: Move) -> None:
    entries, last_state = states(policy)[state]
    ledger = ledger_of(entries)
    # The ledger is in the state the case names (the parser agrees).
    assert (ledger.last.state if ledger and ledger.last else None) == last_state
    assert effects.next_move(ledger, tool(policy)) == move


def test_an_empty_ledger_is_never_attempted() -> None:
    assert effects.next_move(CallLedger(), tool("never")) == Run(1)


# -- the stricter of the recorded policy and the declared one (an attempt in flight)

STRICTER = [
    # (recorded at the attempt, declared now, the tool has a reconcile hook now, the move)
    ("safe", "reconcile", True, Reconcile(1)),
    ("safe", "never", False, AwaitOperator(1, NOT_REPLAYABLE)),
    ("reconcile", "safe", False, AwaitOperator(1, NOT_REPLAYABLE)),  # stricter is reconcile; no hook now
    ("reconcile", "safe", True, Reconcile(1)),
    ("never", "safe", False, AwaitOperator(1, NOT_REPLAYABLE)),
    ("never", "reconcile", True, AwaitOperator(1, NOT_REPLAYABLE)),
    ("", "safe", False, AwaitOperator(1, NOT_REPLAYABLE)),  # a policy the log does not know counts as never
    ("sometimes", "safe", False, AwaitOperator(1, NOT_REPLAYABLE)),
    ("reconcile", "reconcile", False, AwaitOperator(1, NOT_REPLAYABLE)),  # declared without a hook: never
]


@pytest.mark.parametrize(("recorded", "declared", "hook", "move"), STRICTER)
def test_next_move_for_an_attempt_in_flight_takes_the_stricter_policy(
    recorded: str, declared: Replay, hook: bool, move: Move
) -> None:
    ledger = ledger_of([attempt(1, recorded)])
    assert effects.next_move(ledger, tool(declared, hook=hook)) == move


# -- the target's answer

RECONCILED = [
    (Reconciliation("not_done"), Run(3, 2, "not_done")),
    (Reconciliation("done", "the file holds it"), Settled(2, "reconcile", "the file holds it")),
    (Reconciliation("done"), Settled(2, "reconcile", "")),
    (Reconciliation("unknown", "the server is down"), AwaitOperator(2, "the server is down")),
    (Reconciliation("unknown"), AwaitOperator(2, TARGET_CANNOT_TELL)),
]


@pytest.mark.parametrize(("answer", "move"), RECONCILED, ids=[f"{a.state}:{a.result}" for a, _ in RECONCILED])
def test_reconciled(answer: Reconciliation, move: Move) -> None:
    assert effects.reconciled(2, answer) == move


# -- closing a turn around an attempt


@pytest.mark.parametrize(
    ("entries", "left"),
    [
        ([attempt(1, "safe")], False),
        ([attempt(1, "reconcile")], True),
        ([attempt(1, "never")], True),
        ([attempt(1, "")], True),
        ([attempt(1, "never"), result(1)], False),
        ([attempt(1, "never"), unknown(1)], False),  # marked already
        ([attempt(1, "never"), unknown(1), resolved(1, "rerun")], False),
    ],
    ids=["safe", "reconcile", "never", "unrecorded", "done", "unknown", "resolved"],
)
def test_left_unknown_when_a_turn_closes(entries: list[tuple[str, dict[str, Any]]], left: bool) -> None:
    ledger = ledger_of(entries)
    assert ledger is not None and ledger.last is not None
    assert effects.left_unknown(ledger.last) is left
