"""The values the log hands out: a committed event, a read event, a fence."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Fence:
    """Proof of lease ownership carried by turn code. Every fenced append
    re-checks `gen` under the row lock and extends the lease by `ttl`."""

    gen: int
    ttl: float


@dataclass(frozen=True)
class AppendedEvent:
    """An event as its append committed it."""

    session_id: uuid.UUID
    seq: int
    kind: str
    data: dict[str, Any]
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "data": self.data, "at": self.created_at.isoformat()}


@dataclass(frozen=True)
class Intake:
    """The bound on one admission's take of a waiting lane: at most `items`
    inputs and `max_bytes` bytes of their text, but always the first input
    (a single input of the longest allowed still goes in)."""

    items: int
    max_bytes: int


@dataclass(frozen=True)
class LoggedEvent:
    """An event as a read returns it."""

    seq: int
    kind: str
    data: dict[str, Any]


# The session's workload as a lease claim, a release or a releasing append
# leaves it: an open turn, its parked approvals, the inbox cursor against
# the last queued input, and whether the open turn is blocked (it then waits
# for a stimulus, not a worker). (The session's *head* is its last seq.)
# A releasing append also reports `slots_wanted` (runs.SLOTS_WANTED).
WORKLOAD_COLUMNS = (
    "open_turn_seq",
    "pending_approvals",
    "inbox_seq",
    "last_input_seq",
    "blocked_seq",
    "unknown_effects",
    "queued_follow_ups",
    "deferred_seq",
    "deferred_cursor",
    "waiting_tasks",
)


@dataclass(frozen=True)
class Workload:
    open_turn_seq: int | None
    pending_approvals: int
    inbox_seq: int
    last_input_seq: int
    blocked_seq: int | None = None
    unknown_effects: int = 0
    queued_follow_ups: int = 0
    deferred_seq: int = 0
    deferred_cursor: int = 0
    waiting_tasks: int = 0  # the open turn's waits on owned tasks (status waiting_task)
    # Whether any session waits for an agent slot, as the releasing append
    # saw it (runs.SLOTS_WANTED); True where the statement did not look.
    slots_wanted: bool = True

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Workload:
        return cls(
            row["open_turn_seq"],
            int(row["pending_approvals"]),
            int(row["inbox_seq"]),
            int(row["last_input_seq"]),
            row["blocked_seq"],
            int(row["unknown_effects"]),
            int(row["queued_follow_ups"]),
            int(row["deferred_seq"]),
            int(row["deferred_cursor"]),
            int(row["waiting_tasks"]),
            bool(row.get("slots_wanted", True)),
        )

    @property
    def input_pending(self) -> bool:
        """Steer-lane input not yet taken in, or a follow-up owed a turn."""
        return self.last_input_seq > self.inbox_seq or self.queued_follow_ups > 0
