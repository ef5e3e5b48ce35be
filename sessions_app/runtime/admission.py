"""Admission: opening a turn from input, and input riding into a running one.

These append and return; waking a worker is the caller's business (a
service schedules it on commit; a drive is already running).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import models

from sessions_app import log
from sessions_app.errors import InboxFull
from sessions_app.log.reads import Waiting, backlog, first_waiting, pending_deferred, pending_inputs
from sessions_app.log.records import AppendedEvent, Fence, Intake, LoggedEvent
from sessions_app.models import AgentProfile
from sessions_app.runtime import tracing, versions


def intake_bound() -> Intake:
    """What one admission takes of the waiting lanes (settings, TERRET_INTAKE_*)."""
    return Intake(settings.TERRET_INTAKE_MAX_ITEMS, settings.TERRET_INTAKE_MAX_BYTES)


@dataclass(frozen=True)
class Room:
    """A session's bound on pending work (its profile's fields; the fields'
    defaults for a session without a profile)."""

    inputs: int
    nbytes: int
    passive: int


def _field_default(name: str) -> int:
    field = AgentProfile._meta.get_field(name)
    assert isinstance(field, models.Field)
    return int(field.get_default())


def room_of(profile_id: int | None) -> Room:
    names = ("max_waiting_inputs", "max_waiting_bytes", "max_passive_inputs")
    row = AgentProfile.objects.filter(id=profile_id).values_list(*names).first() if profile_id else None
    inputs, nbytes, passive = row if row is not None else tuple(_field_default(n) for n in names)
    return Room(int(inputs), int(nbytes), int(passive))


def check_room(tx: log.SessionTx, text: str, lane: str) -> list[int]:
    """Whether `text` may wait in `lane` (steer, follow_up, passive): under
    the row lock, so two admissions cannot both take the last place. Raises
    InboxFull (nothing written) when it would take the waiting input past
    the profile's count or byte bound. For a passive write, the retention
    policy instead: the seqs of the oldest waiting passive writes that must
    be withdrawn to keep the newest `max_passive_inputs` (the caller
    withdraws them); the write is still refused when the bound is full of
    other input.

    Reads nothing when the cursors say nothing waits (the common case: at
    least one input always fits, however small the bound)."""
    row = tx.row
    if row["last_input_seq"] <= row["inbox_seq"] and row["deferred_seq"] <= row["deferred_cursor"]:
        return []
    room = room_of(row["profile_id"])
    waiting = backlog(tx.session_id, row["inbox_seq"], row["deferred_cursor"], room.inputs + room.passive)
    drop: list[int] = []
    if lane == "passive":
        passive = waiting.passive()
        drop = passive[: max(0, len(passive) - room.passive + 1)]
    gone = set(drop)
    count = waiting.count - len(gone)
    nbytes = waiting.bytes - sum(size for seq, size, _ in waiting.items if seq in gone)
    size = len(text.encode("utf-8", "surrogatepass"))
    if count + 1 > room.inputs:
        raise InboxFull(
            f"session {tx.session_id} has {count} inputs waiting, its bound (max_waiting_inputs {room.inputs}); "
            "send it again once turns have taken some in"
        )
    if nbytes + size > room.nbytes:
        raise InboxFull(
            f"session {tx.session_id} has {nbytes} bytes of input waiting; {size} more would pass its bound "
            f"(max_waiting_bytes {room.nbytes}); send it again once turns have taken some in"
        )
    return drop


@dataclass(frozen=True)
class Opened:
    """A turn's opening: its turn/start seq, and whether steers still wait
    behind what it took (the runner takes them in at its next step)."""

    seq: int
    steers_left: bool
    # The agent version the turn runs under (None: the session has no profile).
    version: int | None = None


def open_turn(tx: log.SessionTx, text: str | None, by: str) -> int:
    """turn/start, then a bounded prefix of the input that waits, then the
    new text; returns the turn/start seq (see `open_taking`)."""
    return open_taking(tx, text, by).seq


def open_taking(tx: log.SessionTx, text: str | None, by: str) -> Opened:
    """turn/start, then whatever input waits (within the intake bound), then
    the new text. With `text` None (a worker opening a turn for woken
    input), the first waiting follow-up, or else the first woken steer,
    becomes the turn's user/message. TurnAlreadyOpen (nothing written) when
    a turn is open: the log refuses a second one, and the caller queues.

    What a turn's opening takes in, in arrival order (docs/protocol.md,
    "Lanes"): the waiting steers, and the deferred lane up to and including
    its first follow-up (passive writes before it as context, the follow-up
    as the turn's message). Later passive writes and follow-ups wait for the
    turn after: one follow-up per turn, so each gets its own answer. A turn
    opened for new `text` stops before the first follow-up: a follow-up is
    never anyone's context. Taking a prefix of each lane is what lets both
    lanes keep a plain cursor.

    The take is bounded (intake_bound, both lanes together, merged in
    arrival order): a flood of waiting input is taken in over several
    turns, never all at once. A turn opened for a follow-up that the bound
    stops short of opens on context alone; the follow-up still waits, owed
    its turn, and the next turn takes the next part, until one reaches it.
    """
    start, version = open_versioned(tx, tracing.turn_start({"by": by} if by else {}))
    steers, _, taken = _take(tx, through_follow_up=text is None)
    follow_up = next((e for e in taken if e.data.get("lane") == "follow_up"), None)
    opener = None if text is not None else (follow_up or _first_woken(taken))
    for item in taken:
        data: dict[str, Any] = {"text": item.data["text"], "source_seq": item.seq}
        if item.data.get("lane"):
            data["lane"] = item.data["lane"]
        tx.append("user/message" if item is opener else "context/injected", data)
    if text:
        tx.append("user/message", {"text": text})
    took = {item.seq for item in taken}
    return Opened(start.seq, steers.more or any(item.seq not in took for item in steers.items), version)


def open_versioned(tx: log.SessionTx, data: dict[str, Any]) -> tuple[AppendedEvent, int | None]:
    """turn/start with the agent version the turn opens on (runtime/versions.py),
    after session/upgraded when the profile's upgrade_policy moves the session
    now, at the turn boundary. The turn/start and its version number."""
    opening = versions.opening(tx.row["profile_id"], tx.row["agent_version"])
    for kind, entry in opening.entries():
        tx.append(kind, entry)
    start = tx.append("turn/start", opening.stamp(data))
    return start, opening.version.number if opening.version is not None else None


def takes_all(tx: log.SessionTx) -> bool:
    """Whether a turn opened now for new text would take in everything that
    waits. False when the backlog is larger than one take (intake_bound):
    then the new text must queue behind it as a follow-up, or it would be
    answered ahead of input that arrived before it."""
    row = tx.row
    if row["last_input_seq"] <= row["inbox_seq"] and row["deferred_seq"] <= row["deferred_cursor"]:
        return True  # the cursors say nothing waits, without a read
    steers, deferred, taken = _take(tx, through_follow_up=False)
    return not (steers.more or deferred.more) and len(taken) == len(steers.items) + len(deferred.items)


def _take(tx: log.SessionTx, *, through_follow_up: bool) -> tuple[Waiting, Waiting, list[LoggedEvent]]:
    """The waiting steers and deferred input (bounded reads), and the prefix
    of both, merged in arrival order, that one opening takes."""
    row = tx.row
    bound = intake_bound()
    # The cursors say whether anything waits, without a read.
    steers = Waiting([], False)
    if row["last_input_seq"] > row["inbox_seq"]:
        steers = pending_inputs(tx.session_id, row["inbox_seq"], bound)
    deferred = Waiting([], False)
    if row["deferred_seq"] > row["deferred_cursor"]:
        deferred = pending_deferred(tx.session_id, row["deferred_cursor"], bound, through_follow_up=through_follow_up)
    return steers, deferred, _within(sorted([*steers.items, *deferred.items], key=lambda e: e.seq), bound)


def _within(items: list[LoggedEvent], bound: Intake) -> list[LoggedEvent]:
    """The longest prefix of `items` within `bound` (at least one item)."""
    out: list[LoggedEvent] = []
    total = 0
    for item in items:
        size = len(item.data["text"].encode())
        if out and (len(out) == bound.items or total + size > bound.max_bytes):
            break
        out.append(item)
        total += size
    return out


def _first_woken(items: list[LoggedEvent]) -> LoggedEvent | None:
    return next((item for item in items if item.data.get("wake")), None)


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
    opening = versions.opening_for_session(session_id)
    if opening is None or opening.entries():
        return []  # an upgrade is due at this boundary (or no session): the locked path writes it
    items: list[tuple[str, dict[str, Any]]] = [
        ("turn/start", opening.stamp(tracing.turn_start({"by": by} if by else {}))),
        ("user/message", {"text": text}),
    ]
    # The version read above is still the session's, or nothing is written.
    return log.append_many(session_id, items, guard=("idle_empty_inbox_at", opening.previous or 0))


def drain_inbox(session_id: uuid.UUID, fence: Fence) -> bool:
    """Queued input rides into the running turn's next step as
    context/injected: a bounded prefix (intake_bound). Whether more steers
    wait behind it, for the step after."""
    with log.locked(session_id, fence=fence) as tx:
        if tx.row["last_input_seq"] <= tx.row["inbox_seq"]:
            return False
        waiting = pending_inputs(session_id, tx.row["inbox_seq"], intake_bound())
        for item in waiting.items:
            tx.append("context/injected", {"text": item.data["text"], "source_seq": item.seq})
        return waiting.more


def has_woken_input(session_id: uuid.UUID, inbox_seq: int, *, follow_ups: int = 0) -> bool:
    """Input that is owed a turn: a woken steer, or a follow-up (counted on
    the session row, so this reads nothing for them)."""
    return follow_ups > 0 or first_waiting(session_id, "input/queued", inbox_seq, wake=True) is not None
