"""What closing an open turn appends, wherever it is closed.

A turn closes from the runner (a cancel seen at a step boundary, a failure)
or, when no worker holds it, straight from the cancel service under the row
lock. Both close it the same way, so the projection never carries a tool
call without its result: every call still owed gets an error result, an
open step gets its step/end (with the usage its assistant message carried),
then turn/end. An owed call whose attempt was in flight, and not safe to
replay, is marked unknown first (tool/unknown): the turn is over, but what
the attempt did is still an operator's question (effects.py).
"""

from __future__ import annotations

from typing import Any

from sessions_app.log.records import LoggedEvent
from sessions_app.runtime.effects import ledgers, left_unknown
from sessions_app.runtime.view import TurnState

Entry = tuple[str, dict[str, Any]]
CANCELLED_RESULT = "cancelled: the turn was cancelled"


def closing_entries(
    events: list[LoggedEvent],
    status: str,
    *,
    error: str = "",
    owed: str = CANCELLED_RESULT,
    by: str = "",
    reason: dict[str, Any] | None = None,
) -> list[Entry]:
    """The entries that close the turn whose events (turn/start onward) are
    `events`: results for owed calls (content `owed`), step/end, turn/end."""
    st = TurnState.parse(events)
    out: list[Entry] = []
    for e in st.events:
        if e.kind != "assistant/message":
            continue
        attempts = ledgers(st.events, after=e.seq)
        for call in st.owed_calls(e):
            result: dict[str, Any] = {"call_id": call.id, "name": call.name, "content": owed, "is_error": True}
            ledger = attempts.get(call.id)
            last = ledger.last if ledger else None
            if last is not None:
                # The attempt ends with the turn, but what it did stays unknown
                # unless replaying it was safe: operators still see it.
                if left_unknown(last):
                    why = f"the turn closed ({status}) while the attempt's outcome was unknown"
                    unknown = {"call_id": call.id, "name": call.name, "attempt": last.number, "reason": why}
                    out.append(("tool/unknown", unknown))
                result.update(attempt=last.number, via="closing")
            out.append(("tool/result", result))
    if st.open_step is not None:
        message = st.assistant_in_open_step()
        usage = message.data.get("usage") if message else None
        end: dict[str, Any] = {"step": st.open_step, "usage": usage} if usage else {"step": st.open_step}
        if not usage and message is None and st.step_spend_known(st.open_step):
            end["usage_recorded"] = True  # a usage/recorded of the step counted its request
        out.append(("step/end", end))
    closed: dict[str, Any] = {"status": status}
    if error:
        closed["error"] = error
    if by:
        closed["by"] = by
    if reason:
        closed["reason"] = reason
    out.append(("turn/end", closed))
    return out
