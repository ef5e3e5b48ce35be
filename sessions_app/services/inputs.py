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
    InputConsumed,
    InvalidInput,
    NotBlocked,
    SessionRevoked,
    TurnAlreadyRunning,
    TurnOpenInLog,
    UnknownInput,
)
from sessions_app.log.catalogue import LANES
from sessions_app.log.reads import (
    answered_by,
    event_at,
    first_waiting,
    input_fate,
    turn_events,
    turn_start_before,
)
from sessions_app.log.records import LoggedEvent
from sessions_app.models import InputReceipt, Session
from sessions_app.runtime import admission, dispatch, limits
from sessions_app.runtime.closing import closing_entries
from sessions_app.runtime.owned import store as owned
from sessions_app.runtime.registry import lease_live

MAX_INPUT_CHARS = 100_000


def resumable(session_id: uuid.UUID | str) -> bool:
    """A turn/start with no turn/end after it."""
    return Session.objects.filter(id=session_id, open_turn_seq__isnull=False).exists()


def check_text(text: Any) -> str:
    """Input text as inject admits it (InvalidInput otherwise): for a door
    that must refuse bad input before a write of its own, e.g. a fork."""
    return _check_text(text)


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
        try:
            turn_seq = admission.open_turn(tx, text, by)
        except log.TurnAlreadyOpen as exc:  # the log's own refusal, behind the check above
            raise TurnAlreadyRunning(f"session {tx.session_id} is mid-turn") from exc
        dispatch.wake(tx.session_id)
    return turn_seq


def _refuse_if_open(tx: log.SessionTx) -> None:
    if tx.row["open_turn_seq"] is None:
        return
    if tx.row["pending_approvals"] > 0 or tx.row["unknown_effects"] > 0 or tx.row["waiting_tasks"] > 0:
        raise TurnAlreadyRunning(f"session {tx.session_id} is mid-turn")
    if lease_live(tx.row):
        raise TurnAlreadyRunning(f"session {tx.session_id} is mid-turn")
    raise TurnOpenInLog(f"session {tx.session_id} has an open turn in its log; resume it")


Lane = Literal["steer", "follow_up", "passive"]
Strategy = Literal["reject", "enqueue", "interrupt"]
STRATEGIES = ("reject", "enqueue", "interrupt")
Disposition = Literal["started", "queued", "held", "placed", "answered", "withdrawn"]


@dataclass(frozen=True)
class Receipt:
    """What became of an input, as far as its recorded stage proves:
    started (it opened a turn), queued, held (a budget or a suspension keeps
    it from starting), placed (in the transcript at `placed_seq`), answered
    (the turn it was placed in ended at `answered_seq`), or withdrawn."""

    disposition: Disposition
    seq: int
    turn_seq: int | None
    idempotency_key: str | None = None
    replayed: bool = False
    held_reason: str | None = None
    lane: str | None = None
    placed_seq: int | None = None
    answered_seq: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "disposition": self.disposition,
            "seq": self.seq,
            "turn_seq": self.turn_seq,
            "idempotency_key": self.idempotency_key,
            "replayed": self.replayed,
        }
        for name in ("held_reason", "lane", "placed_seq", "answered_seq"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
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
    return limits.check(row.id, row.profile, opening=True, budgeted=budgeted, parent=row.parent_session_id)


def _queue(tx: log.SessionTx, text: str, wake: bool, by: str, key: str | None) -> log.AppendedEvent:
    """A steer-lane input/queued (InboxFull past the session's bound)."""
    admission.check_room(tx, text, "steer")
    data: dict[str, Any] = {"text": text, "wake": wake}
    if by:
        data["by"] = by
    if key:
        data["idempotency_key"] = key
    return tx.append("input/queued", data)


def _hold(tx: log.SessionTx, text: str, by: str, key: str | None, over: limits.Stop) -> Receipt:
    queued = _queue(tx, text, True, by, key)
    if tx.row["held_seq"] is None:
        tx.append("input/held", {"source_seq": queued.seq, "reason": over.as_json(), "text": over.message})
    return Receipt("held", queued.seq, None, key, held_reason=over.message)


def _digest(text: str, wake: bool, lane: str | None = None, strategy: str | None = None) -> str:
    # Receipts from before lanes hashed [text, wake]; the same input hashes the same.
    payload: list[Any] = [text, wake] if lane is None and strategy is None else [text, wake, lane, strategy]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


def _check_lane(lane: Any, strategy: Any) -> None:
    if lane is not None and lane not in LANES:
        raise InvalidInput(f"lane must be one of {', '.join(LANES)}")
    if strategy is not None and strategy not in STRATEGIES:
        raise InvalidInput(f"multitask_strategy must be one of {', '.join(STRATEGIES)}")
    if strategy is not None and lane == "passive":
        raise InvalidInput("multitask_strategy applies to input that starts a turn; a passive write starts none")
    if strategy in ("enqueue", "interrupt") and lane == "steer":
        raise InvalidInput(f"multitask_strategy {strategy} queues a follow-up; it cannot be sent as a steer")


def inject(
    session_id: uuid.UUID | str,
    text: str,
    *,
    wake: bool = True,
    by: str = "",
    idempotency_key: str | None = None,
    lane: Lane | None = None,
    multitask_strategy: Strategy | None = None,
) -> Receipt:
    """Admit input. On an idle agent, input that wakes opens a turn
    ("started"); otherwise it is queued durably in its lane ("queued"):

    - steer (the default while a turn runs): rides the running turn's next
      step as context/injected;
    - follow_up: waits for the running turn to end, then opens a turn of its
      own (on an idle agent it starts one at once, as a steer would);
    - passive: starts nothing, and is taken in by the next turn that opens.

    `multitask_strategy` says what input that would start a turn does when
    the agent is busy: reject (TurnAlreadyRunning), enqueue (a follow-up), or
    interrupt (the running turn is cancelled, and this input opens the next).

    Two wakes racing on an idle agent serialize on the row lock: the first
    opens the turn, the second finds it open and queues, so there is exactly
    one turn/start and no text is dropped.
    """
    _check_text(text)
    if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > 200):
        raise InvalidInput("idempotency key must be 1..200 characters")
    _check_lane(lane, multitask_strategy)
    if lane == "passive":
        wake = False
    elif lane == "follow_up" or multitask_strategy is not None:
        wake = True
    # Input for a new turn while a budget is exhausted is kept, held: it runs
    # once the budget allows (runtime/limits.py, the sweep's held input).
    over = admission_stop(session_id, wake=wake)
    if wake and idempotency_key is None and over is None and multitask_strategy != "interrupt":
        receipt = _start_if_idle(session_id, text, by)
        if receipt is not None:
            return receipt
    digest = _digest(text, wake, lane, multitask_strategy)
    with log.locked(session_id) as tx:
        if idempotency_key is not None:
            prior = InputReceipt.objects.filter(session_id=tx.session_id, key=idempotency_key).first()
            if prior is not None:
                if prior.digest != digest:
                    raise IdempotencyConflict("this idempotency key was used with a different payload")
                return Receipt(prior.disposition, prior.seq, prior.turn_seq, idempotency_key, True)  # type: ignore[arg-type]
        receipt = _admit(tx, text, wake, by, idempotency_key, over, lane, multitask_strategy)
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


def _admit(
    tx: log.SessionTx,
    text: str,
    wake: bool,
    by: str,
    key: str | None,
    over: limits.Stop | None,
    lane: Lane | None,
    strategy: Strategy | None,
) -> Receipt:
    if wake and over is not None and tx.row["open_turn_seq"] is None:
        return _hold(tx, text, by, key, over)
    # Follow-ups waiting for their turns are owed those turns first, in
    # arrival order: new input queues behind them in its lane (a steer rides
    # the next turn), never opening a turn that would take them in as context.
    busy = tx.row["open_turn_seq"] is not None or tx.row["queued_follow_ups"] > 0
    if wake and not busy and not admission.takes_all(tx):
        # More waits than one turn takes in (the intake bound): the new text
        # gets its own turn after the backlog, which turns of context drain.
        return _defer(tx, text, "follow_up", by, key)
    if wake and not busy:
        try:
            turn_seq = admission.open_turn(tx, text, by)
        except log.TurnAlreadyOpen:
            pass  # the log's own refusal (the row lock decided above): queue behind the open turn
        else:
            return Receipt("started", tx.appended[-1].seq, turn_seq, key)
    if strategy == "reject":
        raise TurnAlreadyRunning(f"session {tx.session_id} is busy (multitask_strategy reject)")
    if strategy == "interrupt":
        _cancel_in(tx, "")  # the turn and its foreground tasks; background work goes on
    if lane in ("follow_up", "passive") or strategy is not None:
        return _defer(tx, text, lane or "follow_up", by, key)
    event = _queue(tx, text, wake, by, key)
    return Receipt("queued", event.seq, tx.row["open_turn_seq"], key, lane="steer" if lane else None)


def _defer(tx: log.SessionTx, text: str, lane: str, by: str, key: str | None) -> Receipt:
    """A follow-up or a passive write waits (InboxFull past the session's
    bound). A passive write past max_passive_inputs withdraws the oldest
    waiting ones first (the retention policy: passive context keeps its newest)."""
    for seq in admission.check_room(tx, text, lane):
        data: dict[str, Any] = {"source_seq": seq, "lane": "passive", "by": "retention"}
        tx.append("input/withdrawn", {**data, **_cursor_moves(tx, seq, "passive")})
    event = admission.defer(tx, text, lane, by, key)
    return Receipt("queued", event.seq, None, key, lane=lane)


def receipt(session_id: uuid.UUID | str, seq: int) -> Receipt:
    """The receipt of the input at `seq`, with its current disposition, read
    from the log (UnknownInput when `seq` is not an input of this session)."""
    event = event_at(session_id, seq)
    if event is None:
        raise UnknownInput(f"session {session_id} has no input at seq {seq}")
    key = InputReceipt.objects.filter(session_id=session_id, seq=seq).values_list("key", flat=True).first()
    if event.kind == "user/message" and "source_seq" not in event.data:
        # Input that opened its turn at once: placed when it was accepted.
        ended = answered_by(session_id, seq)
        turn = turn_start_before(session_id, seq)
        end = ended.seq if ended else None
        return Receipt("answered" if end else "placed", seq, turn, key, placed_seq=seq, answered_seq=end)
    if event.kind not in ("input/queued", "input/deferred"):
        raise UnknownInput(f"seq {seq} of session {session_id} is a {event.kind}, not an input")
    lane = event.data.get("lane", "steer")
    placed, end_event = input_fate(session_id, seq)
    if placed is None:
        held = Session.objects.filter(id=session_id, held_seq__lte=seq).exists()
        return Receipt("held" if held else "queued", seq, None, key, lane=lane)
    if placed.kind == "input/withdrawn":
        return Receipt("withdrawn", seq, None, key, lane=lane)
    turn = turn_start_before(session_id, placed.seq)
    if end_event is None:
        return Receipt("placed", seq, turn, key, lane=lane, placed_seq=placed.seq)
    return Receipt("answered", seq, turn, key, lane=lane, placed_seq=placed.seq, answered_seq=end_event.seq)


def withdraw(session_id: uuid.UUID | str, seq: int, *, by: str = "") -> Receipt:
    """Take back input that no turn has taken in yet: an input/withdrawn,
    logged with who did it. Input already placed cannot be withdrawn
    (InputConsumed): what the model saw stays seen. Withdrawing it twice
    answers the first withdrawal's receipt."""
    with log.locked(session_id) as tx:
        event = event_at(tx.session_id, seq)
        if event is None or event.kind not in ("input/queued", "input/deferred", "user/message"):
            raise UnknownInput(f"session {tx.session_id} has no input at seq {seq}")
        if event.kind == "user/message":
            raise InputConsumed(f"input {seq} opened its turn when it arrived; a consumed input cannot be withdrawn")
        placed, _ = input_fate(tx.session_id, seq)
        lane = event.data.get("lane", "steer")
        if placed is not None and placed.kind == "input/withdrawn":
            return Receipt("withdrawn", seq, None, None, replayed=True, lane=lane)
        if placed is not None:
            raise InputConsumed(
                f"input {seq} was taken into the transcript at seq {placed.seq}; a consumed input cannot be withdrawn"
            )
        data: dict[str, Any] = {"source_seq": seq, "lane": lane, **_cursor_moves(tx, seq, lane)}
        if by:
            data["by"] = by
        tx.append("input/withdrawn", data)
    return Receipt("withdrawn", seq, None, None, lane=lane)


def _cursor_moves(tx: log.SessionTx, seq: int, lane: str) -> dict[str, Any]:
    """How far the withdrawal may move its lane's cursor: up to the next
    input that still waits (all the way when none does), and only when
    nothing before it still waits. Decided under the row lock, from the
    seqs of single rows (never the lane's text: a lane may hold a flood)."""
    row = tx.row
    steer = lane == "steer"
    cursor, head = (row["inbox_seq"], row["last_input_seq"]) if steer else (row["deferred_cursor"], row["deferred_seq"])
    kind = "input/queued" if steer else "input/deferred"
    first = first_waiting(tx.session_id, kind, cursor, other_than=seq)
    out: dict[str, Any] = {}
    if first is None or first > seq:
        to = first - 1 if first is not None else head
        if to > cursor:
            out["inbox_to" if steer else "deferred_to"] = to
    if row["held_seq"] is not None:
        sid = tx.session_id
        woken = first_waiting(sid, "input/queued", row["inbox_seq"], wake=True, other_than=seq)
        follow = first_waiting(sid, "input/deferred", row["deferred_cursor"], lane="follow_up", other_than=seq)
        if woken is None and follow is None:
            out["unhold"] = True
    return out


def _start_if_idle(session_id: uuid.UUID | str, text: str, by: str) -> Receipt | None:
    """admission.start_if_idle, then the wake-up; None when it wrote nothing."""
    events = admission.start_if_idle(session_id, text, by)
    if not events:
        return None
    dispatch.wake(events[0].session_id)
    return Receipt("started", events[-1].seq, events[0].seq, None)


def cancel(session_id: uuid.UUID | str, *, by: str = "") -> bool:
    """Stop: cancel the open turn and every live task the session owns (the
    full-stop policy, docs/protocol.md "Tasks"). The turn is marked cancelled
    first, then every standing approval request is denied, in that order, so
    a parked call unparks into a turn that already knows it is stopping; the
    tasks' abort intent commits in the same transaction, before any signal.
    A worker driving the turn notices within about a second (runtime/stop.py)
    and stops its model stream. A turn no worker holds (parked, blocked, or
    admitted and not yet claimed) is closed here and now, under the row lock:
    waiting for a worker would make Stop depend on one; but a turn parked on
    its own foreground tasks closes only after their receipts (descendants
    settle before the owner's cleanup): the last receipt wakes it. Returns
    False when there was neither an open turn nor a live task."""
    with log.locked(session_id) as tx:
        return _cancel_in(tx, by, stop_all=True)


def _cancel_in(tx: log.SessionTx, by: str, *, stop_all: bool = False) -> bool:
    turn_seq = tx.row["open_turn_seq"]
    # Owned work first: the turn's foreground tasks always (they cannot
    # outlive it), background ones on a full stop only.
    live = owned.live_tasks(tx.session_id)
    mine = live.filter(background=False, turn_seq=turn_seq) if turn_seq is not None else live.none()
    aborted = owned.request_abort(list(live if stop_all else mine), f"stopped by {by}" if by else "stopped")
    if turn_seq is None:
        return bool(aborted)
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
    if mine.exists():
        return True  # parked on them: their cancelled receipts wake the turn, which then closes
    lapsed = tx.fence_out()
    seen = events + [LoggedEvent(e.seq, e.kind, e.data) for e in tx.appended]
    for kind, data in closing_entries(seen, "cancelled", by=by):
        tx.append(kind, data)
    if lapsed:
        dispatch.wake(tx.session_id)  # what its holder would have driven next (deferred input) gets a driver
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
