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
    input), the first woken item becomes the turn's user/message.

    What a turn's opening takes in, in arrival order (docs/protocol.md,
    "Lanes"): every waiting steer, and the deferred lane up to and including
    its first follow-up (passive writes before it as context, the follow-up
    as the turn's message). Later passive writes and follow-ups wait for the
    turn after: one follow-up per turn, so each gets its own answer. Taking a
    prefix of each lane is what lets both lanes keep a plain cursor.
    """
    start = tx.append("turn/start", tracing.turn_start({"by": by} if by else {}))
    row = tx.row
    # The cursors say whether anything waits, without a read.
    steers = pending_inputs(tx.session_id, row["inbox_seq"]) if row["last_input_seq"] > row["inbox_seq"] else []
    deferred: list[LoggedEvent] = []
    if row["deferred_seq"] > row["deferred_cursor"]:
        for item in pending_deferred(tx.session_id, row["deferred_cursor"]):
            deferred.append(item)
            if item.data["lane"] == "follow_up":
                break
    for item in sorted([*steers, *deferred], key=lambda e: e.seq):
        lane = item.data.get("lane")
        woken = item.data.get("wake") or lane == "follow_up"
        kind = "user/message" if text is None and woken else "context/injected"
        data: dict[str, Any] = {"text": item.data["text"], "source_seq": item.seq}
        if lane:
            data["lane"] = lane
        tx.append(kind, data)
        if kind == "user/message":
            text = ""  # the first woken item opened the turn; the rest ride along
    if text:
        tx.append("user/message", {"text": text})
    return start.seq


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
