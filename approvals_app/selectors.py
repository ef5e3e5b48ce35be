"""Approval state, read from the open turn only.

An approval belongs to the turn that asked for it. A verdict applies to a
call only if it follows a request *in the open turn* naming the same call id,
tool and arguments: provider call ids are not unique across turns, and a
verdict about other arguments is a verdict about something else.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sessions_app.models import Session
from sessions_app.selectors import LoggedEvent, turn_events


@dataclass(frozen=True)
class PendingCall:
    call_id: str
    name: str
    args: dict[str, Any]
    seq: int

    def as_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "name": self.name, "args": self.args}


@dataclass(frozen=True)
class Verdict:
    verdict: str  # approve | deny
    reason: str


def canonical(args: Any) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def pending_from_events(events: list[LoggedEvent]) -> list[PendingCall]:
    requested: dict[str, PendingCall] = {}
    for e in events:
        if e.kind == "approval/requested":
            requested[e.data["call_id"]] = PendingCall(e.data["call_id"], e.data["name"], e.data["args"], e.seq)
        elif e.kind == "approval/resolved":
            requested.pop(e.data["call_id"], None)
    return sorted(requested.values(), key=lambda p: p.seq)


def pending(session_id: uuid.UUID | str) -> list[PendingCall]:
    """The open turn's calls still awaiting a verdict (none once the turn ends)."""
    turn_seq = Session.objects.filter(id=session_id).values_list("open_turn_seq", flat=True).first()
    if turn_seq is None:
        return []
    return pending_from_events(turn_events(session_id, turn_seq))


def request_in_turn(events: list[LoggedEvent], call_id: str, name: str, args: Any) -> LoggedEvent | None:
    """The latest request in this turn bound to exactly this call."""
    want = canonical(args)
    found: LoggedEvent | None = None
    for e in events:
        if (
            e.kind == "approval/requested"
            and e.data["call_id"] == call_id
            and e.data["name"] == name
            and canonical(e.data["args"]) == want
        ):
            found = e
    return found


def verdict_in_turn(events: list[LoggedEvent], call_id: str, name: str, args: Any) -> Verdict | None:
    request = request_in_turn(events, call_id, name, args)
    if request is None:
        return None
    for e in events:
        if e.seq > request.seq and e.kind == "approval/resolved" and e.data["call_id"] == call_id:
            return Verdict(e.data["verdict"], e.data.get("reason", ""))
    return None
