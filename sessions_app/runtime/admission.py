"""Admission: opening a turn from input, and input riding into a running one.

These append and return; waking a worker is the caller's business (a
service schedules it on commit; a drive is already running).
"""

from __future__ import annotations

import uuid
from typing import Any

from sessions_app import log
from sessions_app.log.reads import pending_inputs
from sessions_app.log.records import AppendedEvent, Fence


def open_turn(tx: log.SessionTx, text: str | None, by: str) -> int:
    """turn/start, then whatever input was queued, then the new text; returns
    the turn/start seq. Queued input goes first so the projection keeps
    arrival order. With `text` None (a worker opening a turn for woken
    input), the first woken item becomes the turn's user/message."""
    start = tx.append("turn/start", {"by": by} if by else {})
    # The inbox cursor says whether anything is queued, without a read.
    queued = (
        pending_inputs(tx.session_id, tx.row["inbox_seq"]) if tx.row["last_input_seq"] > tx.row["inbox_seq"] else []
    )
    for item in queued:
        kind = "user/message" if text is None and item.data.get("wake") else "context/injected"
        tx.append(kind, {"text": item.data["text"], "source_seq": item.seq})
        if kind == "user/message":
            text = ""  # the first woken item opened the turn; the rest ride along
    if text:
        tx.append("user/message", {"text": text})
    return start.seq


def start_if_idle(session_id: uuid.UUID | str, text: str, by: str) -> list[AppendedEvent]:
    """The common admission, a wake on an idle agent with nothing queued, as
    one guarded statement: the UPDATE's row lock decides "idle" and writes
    turn/start + user/message, so no transaction is held open around a
    separate read. Empty (nothing written) when the agent is not idle or
    input is queued; the caller then takes the locked path, which handles both."""
    items: list[tuple[str, dict[str, Any]]] = [
        ("turn/start", {"by": by} if by else {}),
        ("user/message", {"text": text}),
    ]
    return log.append_many(session_id, items, guard="idle_empty_inbox")


def drain_inbox(session_id: uuid.UUID, fence: Fence) -> None:
    """Queued input rides into the running turn's next step as context/injected."""
    with log.locked(session_id, fence=fence) as tx:
        for item in pending_inputs(session_id, tx.row["inbox_seq"]):
            tx.append("context/injected", {"text": item.data["text"], "source_seq": item.seq})


def has_woken_input(session_id: uuid.UUID, inbox_seq: int) -> bool:
    return any(item.data.get("wake") for item in pending_inputs(session_id, inbox_seq))
