"""An operator's answer to an effect of unknown outcome (effect ledger).

`resolve` validates (check), then decides and appends under the session's
row lock (do): the attempt must still be unknown, and a rerun needs its
turn open, since nothing else would run it. The worker woken on commit
carries the turn on: a new attempt under the same key, or the result the
operator gave (runtime/effects.py next_move decides, runtime/calls.py
carries it out).

A monitor's send of unknown outcome (a host effect: its attempt names an
edition, sessions_app/monitors/run.py) is answered here too, by the same
rule and the same event; its turn does not matter (it has none), and the
answer is carried onto the edition in the same transaction: done (the
result is the destination's receipt) confirms it with its delivered
entries, failed hands its items to the next edition, rerun makes it
`prepared` for the monitor's clock to send again under the same key.

`effects` (the ledger's read, from runtime/effects.py) is re-exported for
the interfaces, which do not import the runtime.
"""

from __future__ import annotations

import uuid
from typing import Any

from sessions_app import log
from sessions_app.errors import EffectNotPending, InvalidInput, UnknownEffect
from sessions_app.log.catalogue import RESOLUTIONS
from sessions_app.monitors import run as monitor_run
from sessions_app.runtime import dispatch
from sessions_app.runtime.effects import Effect, call_effects, effects
from sessions_app.validation import clean_text

__all__ = ["MAX_REASON_CHARS", "MAX_RESULT_CHARS", "Effect", "check_resolution", "effects", "resolve"]

MAX_RESULT_CHARS = 20_000
MAX_REASON_CHARS = 500


def check_resolution(action: Any, result: Any, reason: Any) -> tuple[str, str, str]:
    if action not in RESOLUTIONS:
        raise InvalidInput(f"action must be one of {', '.join(RESOLUTIONS)}")
    for name, value, limit in (("result", result, MAX_RESULT_CHARS), ("reason", reason, MAX_REASON_CHARS)):
        if value is not None and not isinstance(value, str):
            raise InvalidInput(f"{name} must be a string")
        if value and len(clean_text(name, value)) > limit:
            raise InvalidInput(f"{name} must be at most {limit} characters")
    if result and action == "rerun":
        raise InvalidInput("a rerun takes no result: the tool's own run gives it")
    return action, result or "", reason or ""


def resolve(
    session_id: uuid.UUID | str, call_id: str, action: str, *, result: str = "", reason: str = "", by: str
) -> Effect:
    """Resolve the newest unknown attempt of `call_id`; returns it as it was."""
    action, result, reason = check_resolution(action, result, reason)
    call_id = clean_text("call id", call_id)  # from a URL path, where %00 is a NUL; it reaches a query
    if not by:
        raise InvalidInput("a resolution names its actor")
    with log.locked(session_id) as tx:
        attempts = call_effects(tx.session_id, call_id)  # bounded: this call's events, under the lock
        if not attempts:
            raise UnknownEffect(f"no attempt of call {call_id!r} is on record in this session")
        pending = [e for e in attempts if e.state == "unknown"]
        if not pending:
            raise EffectNotPending(f"call {call_id!r} has no attempt of unknown outcome (it is {attempts[-1].state})")
        target = pending[-1]
        if target.edition_id is not None:
            monitor_run.check_resolution(target.edition_id, action, result)
        elif action == "rerun" and not (target.turn_open and tx.row["open_turn_seq"] == target.turn_seq):
            raise EffectNotPending("its turn has ended, so nothing would run it again: mark it done or failed")
        data: dict[str, Any] = {"call_id": call_id, "attempt": target.attempt, "action": action, "by": by}
        if result:
            data["result"] = result
        if reason:
            data["reason"] = reason
        if target.edition_id is not None:
            data["edition_id"] = target.edition_id
        tx.append("tool/resolved", data)
        if target.edition_id is not None:
            monitor_run.resolved(tx, target.edition_id, action, by, reason)
        elif target.turn_open and tx.row["unknown_effects"] <= 1:
            dispatch.wake(tx.session_id)  # on commit; the worker settles the call
    return target
