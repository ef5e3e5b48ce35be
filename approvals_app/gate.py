"""The approval gate. It runs at execute, after every pre_execute veto has
settled, so a call the allow-list refuses never reaches a human.

Verdicts come from the log, so after a restart a decided call is never asked
again; a parked call holds no worker (the loop returns, and the commit of
approval/resolved wakes one).
"""

from __future__ import annotations

import uuid
from typing import Any

from approvals_app.selectors import approval_records, auto_approved
from sessions_app import log
from sessions_app.log.records import LoggedEvent
from sessions_app.models import Event
from sessions_app.runtime.hooks import CallContext, GateDecision
from sessions_app.tools.base import Definition


def approval_mode(defn: Definition, overrides: dict[str, Any]) -> str:
    mode = overrides.get(defn.name, defn.approval)
    # An unreadable override fails safe: ask.
    return mode if mode in ("never", "policy", "always") else "always"


def needs_approval(defn: Definition, overrides: dict[str, Any]) -> bool:
    mode = approval_mode(defn, overrides)
    return mode == "always" or (mode == "policy" and defn.mutating)


def check(
    events: list[LoggedEvent],
    defn: Definition,
    overrides: dict[str, Any],
    call_id: str,
    args: Any,
    *,
    after_seq: int = 0,
    ctx: CallContext | None = None,
) -> GateDecision:
    """run: go ahead; deny: a recorded denial; park: asked, no verdict yet;
    ask: append approval/requested (see `request`), then park.

    `events` are the open turn's; `after_seq` is the seq of the assistant
    message that made the call, so a request (and its verdict) made for an
    earlier call that happened to reuse the id and arguments does not count.

    An approval binds to the request (call id, tool, the model's arguments);
    when the reviewer edited the arguments, `run` carries them (`args`) and
    they, not the model's, are what runs. `ctx` (the runner's, with the
    policy in force) lets a session's "allow this tool" waiver apply.
    """
    if not needs_approval(defn, overrides):
        return GateDecision("run")
    records = [r for r in approval_records(events) if r.seq > after_seq and r.call_id == call_id]
    bound = [r for r in records if r.binds(call_id, defn.name, args)]
    record = bound[-1] if bound else None
    if record is None or record.superseded:
        # A provider that repeats a call id within one message: wait behind
        # the unsettled request rather than supersede it (superseding would
        # leave pending_approvals counting a request nobody can decide).
        if any(r.open for r in records):
            return GateDecision("park")
        if _waived(ctx, defn):
            return GateDecision("run")
        return GateDecision("ask")
    if record.verdict is None:
        return GateDecision("park")
    if record.verdict.verdict == "approve":
        return GateDecision("run", args=record.verdict.edited_args)
    return GateDecision("deny", record.verdict.reason or "denied by reviewer")


def _waived(ctx: CallContext | None, defn: Definition) -> bool:
    """Has a reviewer allowed this tool for the rest of the session? Judged by
    the policy in force as of the runner's commit right before the veto."""
    if ctx is None or not ctx.policy_known:
        return False
    return auto_approved(ctx.session_id, ctx.policy_seq, defn.name)


def request(session_id: uuid.UUID, fence: log.Fence | None, call_id: str, name: str, args: dict[str, Any]) -> bool:
    """Append approval/requested unless the turn is being cancelled.

    Checked under the row lock: cancel() denies every standing request in
    the same transaction that marks the turn cancelled, so a request appended
    after that would dangle with no one left to deny it. Returns False (and
    appends nothing) when the turn is cancelled or already closed.
    """
    with log.locked(session_id, fence=fence) as tx:
        turn_seq = tx.row["open_turn_seq"]
        if turn_seq is None:
            return False
        cancelled = Event.objects.filter(
            session_id=tx.session_id, kind="turn/cancel_requested", seq__gte=turn_seq
        ).exists()
        if cancelled:
            return False
        tx.append("approval/requested", {"call_id": call_id, "name": name, "args": args})
    return True
