"""Admission: opening a turn from input, and input riding into a running one.

These append and return; waking a worker is the caller's business (a
service schedules it on commit; a drive is already running).
"""

from __future__ import annotations

import uuid
from typing import Any

from sessions_app import log
from sessions_app.log.reads import pending_deferred, pending_inputs
from sessions_app.log.records import AppendedEvent, Fence, LoggedEvent
from sessions_app.runtime import tracing


def open_turn(tx: log.SessionTx, text: str | None, by: str) -> int:
    """turn/start, then whatever input waits, then the new text; returns the
    turn/start seq. With `text` None (a worker opening a turn for woken
    input), the first waiting follow-up, or else the first woken steer,
    becomes the turn's user/message. TurnAlreadyOpen (nothing written) when
    a turn is open: the log refuses a second one, and the caller queues.

    What a turn's opening takes in, in arrival order (docs/protocol.md,
    "Lanes"): every waiting steer, and the deferred lane up to and including
    its first follow-up (passive writes before it as context, the follow-up
    as the turn's message). Later passive writes and follow-ups wait for the
    turn after: one follow-up per turn, so each gets its own answer. A turn
    opened for new `text` stops before the first follow-up: a follow-up is
    never anyone's context. Taking a prefix of each lane is what lets both
    lanes keep a plain cursor.
    """
    start = tx.append("turn/start", tracing.turn_start({"by": by} if by else {}))
    row = tx.row
    # The cursors say whether anything waits, without a read.
    steers = pending_inputs(tx.session_id, row["inbox_seq"]) if row["last_input_seq"] > row["inbox_seq"] else []
    deferred: list[LoggedEvent] = []
    follow_up: LoggedEvent | None = None
    if row["deferred_seq"] > row["deferred_cursor"]:
        for item in pending_deferred(tx.session_id, row["deferred_cursor"]):
            if item.data["lane"] == "follow_up":
                follow_up = item if text is None else None
                break
            deferred.append(item)
    opener = None if text is not None else (follow_up or _first_woken(steers))
    for item in sorted([*steers, *deferred, *([follow_up] if follow_up else [])], key=lambda e: e.seq):
        data: dict[str, Any] = {"text": item.data["text"], "source_seq": item.seq}
        if item.data.get("lane"):
            data["lane"] = item.data["lane"]
        tx.append("user/message" if item is opener else "context/injected", data)
    if text:
        tx.append("user/message", {"text": text})
    return start.seq


def _first_woken(steers: list[LoggedEvent]) -> LoggedEvent | None:
    return next((item for item in steers if item.data.get("wake")), None)


def defer(tx: log.SessionTx, text: str, lane: str, by: str, key: str | None = None, **extra: Any) -> AppendedEvent:
    """Input in a lane that waits for a turn boundary (input/deferred): a
    follow-up or a passive write. The caller wakes the session for a follow-up."""
    data: dict[str, Any] = {"text": text, "lane": lane, **extra}
    if by:
        data["by"] = by
    if key:
        data["idempotency_key"] = key
    return tx.append("input/deferred", data)


def start_if_idle(session_id: uuid.UUID | str, text: str, by: str) -> list[AppendedEvent]:
    """The common admission, a wake on an idle agent with nothing queued, as
    one guarded statement: the UPDATE's row lock decides "idle" and writes
    turn/start + user/message, so no transaction is held open around a
    separate read. Empty (nothing written) when the agent is not idle or
    input is queued; the caller then takes the locked path, which handles both."""
    items: list[tuple[str, dict[str, Any]]] = [
        ("turn/start", tracing.turn_start({"by": by} if by else {})),
        ("user/message", {"text": text}),
    ]
    return log.append_many(session_id, items, guard="idle_empty_inbox")


def drain_inbox(session_id: uuid.UUID, fence: Fence) -> None:
    """Queued input rides into the running turn's next step as context/injected."""
    with log.locked(session_id, fence=fence) as tx:
        for item in pending_inputs(session_id, tx.row["inbox_seq"]):
            tx.append("context/injected", {"text": item.data["text"], "source_seq": item.seq})


def has_woken_input(session_id: uuid.UUID, inbox_seq: int, *, follow_ups: int = 0) -> bool:
    """Input that is owed a turn: a woken steer, or a follow-up (counted on
    the session row, so this reads nothing for them)."""
    return follow_ups > 0 or any(item.data.get("wake") for item in pending_inputs(session_id, inbox_seq))
