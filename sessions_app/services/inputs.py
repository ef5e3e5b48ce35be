"""Writes on behalf of people: input to a session (admission), and cancel.

Each function validates, then takes the session row lock (log.locked) for
the check-then-act, appends, and schedules the wake-up to go out on commit.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from approvals_app.selectors import pending_from_events
from sessions_app import log
from sessions_app.errors import (
    IdempotencyConflict,
    InvalidInput,
    NotBlocked,
    SessionRevoked,
    TurnAlreadyRunning,
    TurnOpenInLog,
)
from sessions_app.log.reads import turn_events
from sessions_app.log.records import LoggedEvent
from sessions_app.models import InputReceipt, Session
from sessions_app.runtime import admission, dispatch, limits
from sessions_app.runtime.closing import closing_entries
from sessions_app.runtime.registry import lease_live

MAX_INPUT_CHARS = 100_000


def resumable(session_id: uuid.UUID | str) -> bool:
    """A turn/start with no turn/end after it."""
    return Session.objects.filter(id=session_id, open_turn_seq__isnull=False).exists()


def _check_text(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("text must be a non-empty string")
    if "\x00" in text:
        raise InvalidInput("text must not contain NUL characters")
    if len(text) > MAX_INPUT_CHARS:
        raise InvalidInput(f"text is longer than {MAX_INPUT_CHARS} characters")
    return text


def run_turn(session_id: uuid.UUID | str, text: str, *, by: str = "") -> int:
    """Open a turn with `text` as input and wake a worker. Returns the turn/start seq.

    Raises TurnAlreadyRunning when the agent is mid-turn (running or parked),
    and TurnOpenInLog when the agent is idle but the log holds an open turn
    (a crashed one): that turn must be resumed, never shadowed by a second
    turn/start. Appends nothing in either case.
    """
    _check_text(text)
    with log.locked(session_id) as tx:
        _refuse_if_open(tx)
        turn_seq = admission.open_turn(tx, text, by)
        dispatch.wake(tx.session_id)
    return turn_seq


def _refuse_if_open(tx: log.SessionTx) -> None:
    if tx.row["open_turn_seq"] is None:
        return
    if tx.row["pending_approvals"] > 0 or tx.row["unknown_effects"] > 0 or lease_live(tx.row):
        raise TurnAlreadyRunning(f"session {tx.session_id} is mid-turn")
    raise TurnOpenInLog(f"session {tx.session_id} has an open turn in its log; resume it")


@dataclass(frozen=True)
class Receipt:
    disposition: Literal["started", "queued", "held"]
    seq: int
    turn_seq: int | None
    idempotency_key: str | None = None
    replayed: bool = False
    held_reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "disposition": self.disposition,
            "seq": self.seq,
            "turn_seq": self.turn_seq,
            "idempotency_key": self.idempotency_key,
            "replayed": self.replayed,
        }
        if self.held_reason is not None:
            out["held_reason"] = self.held_reason
        return out


def admission_stop(session_id: uuid.UUID | str, *, wake: bool) -> limits.Stop | None:
    """What keeps input from starting a turn now: an operator's suspension, or
    a budget (only input that would wake asks). A revoked session takes none."""
    row = Session.objects.select_related("profile").filter(id=session_id).first()
    if row is None:
        return None  # log.locked reports the missing session
    if row.revoked_seq is not None:
        raise SessionRevoked(f"session {row.id} is revoked; a staff member must restore it first")
    if not wake:
        return None
    hold = limits.hold_of(row.profile, suspended=row.suspended_seq is not None)
    if hold is not None:
        return hold
    budgeted = any(getattr(row, f"budget_{name}") is not None for name in limits.BUDGETS)
    return limits.check(row.id, row.profile, opening=True, budgeted=budgeted)


def _hold(tx: log.SessionTx, text: str, by: str, key: str | None, over: limits.Stop) -> Receipt:
    data: dict[str, Any] = {"text": text, "wake": True}
    if by:
        data["by"] = by
    if key:
        data["idempotency_key"] = key
    queued = tx.append("input/queued", data)
    if tx.row["held_seq"] is None:
        tx.append("input/held", {"source_seq": queued.seq, "reason": over.as_json(), "text": over.message})
    return Receipt("held", queued.seq, None, key, held_reason=over.message)


def _digest(text: str, wake: bool) -> str:
    return hashlib.sha256(json.dumps([text, wake]).encode()).hexdigest()


def inject(
    session_id: uuid.UUID | str, text: str, *, wake: bool = False, by: str = "", idempotency_key: str | None = None
) -> Receipt:
    """Admit input. On an idle agent with wake=True it opens a turn
    ("started"); otherwise it is queued durably and rides the next step of the
    running turn, or the next turn ("queued").

    Two wakes racing on an idle agent serialize on the row lock: the first
    opens the turn, the second finds it open and queues, so there is exactly
    one turn/start and no text is dropped.
    """
    _check_text(text)
    if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > 200):
        raise InvalidInput("idempotency key must be 1..200 characters")
    # Input for a new turn while a budget is exhausted is kept, held: it runs
    # once the budget allows (runtime/limits.py, the sweep's held input).
    over = admission_stop(session_id, wake=wake)
    if wake and idempotency_key is None and over is None:
        receipt = _start_if_idle(session_id, text, by)
        if receipt is not None:
            return receipt
    digest = _digest(text, wake)
    with log.locked(session_id) as tx:
        if idempotency_key is not None:
            prior = InputReceipt.objects.filter(session_id=tx.session_id, key=idempotency_key).first()
            if prior is not None:
                if prior.digest != digest:
                    raise IdempotencyConflict("this idempotency key was used with a different payload")
                return Receipt(prior.disposition, prior.seq, prior.turn_seq, idempotency_key, True)  # type: ignore[arg-type]
        if wake and tx.row["open_turn_seq"] is None and over is None:
            turn_seq = admission.open_turn(tx, text, by)
            receipt = Receipt("started", tx.appended[-1].seq, turn_seq, idempotency_key)
        elif wake and tx.row["open_turn_seq"] is None and over is not None:
            receipt = _hold(tx, text, by, idempotency_key, over)
        else:
            data: dict[str, Any] = {"text": text, "wake": wake}
            if by:
                data["by"] = by
            if idempotency_key:
                data["idempotency_key"] = idempotency_key
            event = tx.append("input/queued", data)
            receipt = Receipt("queued", event.seq, tx.row["open_turn_seq"], idempotency_key)
        if idempotency_key is not None:
            InputReceipt.objects.create(
                session_id=tx.session_id,
                key=idempotency_key,
                digest=digest,
                disposition=receipt.disposition,
                seq=receipt.seq,
                turn_seq=receipt.turn_seq,
            )
        if (wake or receipt.disposition == "started") and receipt.disposition != "held":
            dispatch.wake(tx.session_id)
    return receipt


def _start_if_idle(session_id: uuid.UUID | str, text: str, by: str) -> Receipt | None:
    """admission.start_if_idle, then the wake-up; None when it wrote nothing."""
    events = admission.start_if_idle(session_id, text, by)
    if not events:
        return None
    dispatch.wake(events[0].session_id)
    return Receipt("started", events[-1].seq, events[0].seq, None)


def cancel(session_id: uuid.UUID | str, *, by: str = "") -> bool:
    """Cancel the open turn: mark it cancelled first, then deny every standing
    approval request, in that order, so a parked call unparks into a turn that
    already knows it is stopping. A worker driving the turn notices within
    about a second (runtime/stop.py) and stops its model stream. A turn no
    worker holds (parked, blocked, or admitted and not yet claimed) is closed
    here and now, under the row lock: waiting for a worker would make Stop
    depend on one. Returns False when there is no open turn."""
    with log.locked(session_id) as tx:
        turn_seq = tx.row["open_turn_seq"]
        if turn_seq is None:
            return False
        events = turn_events(tx.session_id, turn_seq)
        if not any(e.kind == "turn/cancel_requested" for e in events):
            tx.append("turn/cancel_requested", {"by": by} if by else {})
        for call in pending_from_events(events):
            data = {"call_id": call.call_id, "verdict": "deny", "reason": "turn cancelled"}
            if by:
                data["by"] = by
            tx.append("approval/resolved", data)
        if lease_live(tx.row):
            dispatch.wake(tx.session_id)
            return True
        seen = events + [LoggedEvent(e.seq, e.kind, e.data) for e in tx.appended]
        for kind, data in closing_entries(seen, "cancelled", by=by):
            tx.append(kind, data)
    return True


def retry(session_id: uuid.UUID | str, *, by: str = "", reason: str = "") -> None:
    """Drive a blocked turn again now (NotBlocked if it is not blocked). The
    turn gets one more attempt; if that fails too it is blocked again."""
    with log.locked(session_id) as tx:
        if tx.row["open_turn_seq"] is None or tx.row["blocked_seq"] is None:
            raise NotBlocked(f"session {tx.session_id} has no blocked turn")
        data = {"by": by} if by else {}
        if reason:
            data["reason"] = reason
        tx.append("turn/retry_requested", data)
        dispatch.wake(tx.session_id)
