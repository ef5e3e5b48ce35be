"""The approval gate. It runs at execute, after every pre_execute veto has
settled, so a call the allow-list refuses never reaches a human.

Verdicts come from the log, so after a restart a decided call is never asked
again; a parked call holds no worker (the loop returns, and the commit of
approval/resolved wakes one).

An approval carries its authority: when its call is about to start, the
verdict is checked against the reviewer's current standing (active, still
holding the grounds the verdict recorded) and the session's (not revoked
since). A void one is recorded (approval/voided) and the call asked about
again in the same transaction; it never runs on a dead grant. Once the call's
first attempt is committed the grant has been used, and the effect ledger
owns the call.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model

from approvals_app.selectors import Verdict, approval_records, auto_approved, waiver_grant
from sessions_app import log
from sessions_app.log.records import LoggedEvent
from sessions_app.models import AgentProfile, Event
from sessions_app.permissions import lapsed
from sessions_app.runtime.hooks import CallContext, GateDecision
from sessions_app.tools.base import Definition


def approval_mode(defn: Definition, overrides: dict[str, Any]) -> str:
    mode = overrides.get(defn.name, defn.approval)
    if isinstance(mode, dict):  # the tool's own approval settings (runtime/profiles.py)
        mode = mode.get("mode", defn.approval)
    # An unreadable override fails safe: ask.
    return mode if mode in ("never", "policy", "always") else "always"


DEADLINE_KEYS = ("approval_deadline_s", "remind_every_s", "escalate_to", "on_expiry")


def deadline_for(profile: AgentProfile | None, overrides: dict[str, Any], tool: str) -> dict[str, Any] | None:
    """The clock a request for `tool` runs on: the profile's deadline settings,
    each overridden by the tool's own (its entry in `approvals`, when that is
    an object); None when it sets neither a deadline nor reminders (seed 000:
    a parked approval has no timeout unless one is asked for)."""
    values: dict[str, Any] = {}
    if profile is not None:
        escalate = profile.escalate_to if profile.escalate_to_id else None  # no query for none
        group = escalate.name if escalate is not None else None
        values = {
            "approval_deadline_s": profile.approval_deadline_s,
            "remind_every_s": profile.remind_every_s,
            "escalate_to": group,
            "on_expiry": profile.on_expiry,
        }
    own = overrides.get(tool)
    if isinstance(own, dict):
        values.update({k: own[k] for k in DEADLINE_KEYS if k in own})
    deadline, remind = _seconds(values.get("approval_deadline_s")), _seconds(values.get("remind_every_s"))
    if deadline is None and remind is None:
        return None
    on_expiry = values.get("on_expiry") if values.get("on_expiry") in ("deny", "park") else "deny"
    escalate = values.get("escalate_to")
    return {
        "deadline_s": deadline,
        "remind_every_s": remind,
        "escalate_to": escalate if isinstance(escalate, str) and escalate else None,
        "on_expiry": on_expiry,
    }


def _deadline(ctx: CallContext | None, overrides: dict[str, Any], defn: Definition) -> dict[str, Any] | None:
    return deadline_for(ctx.profile if ctx is not None else None, overrides, defn.name)


def _seconds(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


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
            lapse = waiver_lapsed(ctx, defn)
            if lapse is None:
                return GateDecision("run")
            why = f"the reviewer's allow-for-this-session no longer stands ({lapse})"
            return GateDecision("ask", why, deadline=_deadline(ctx, overrides, defn))
        return GateDecision("ask", deadline=_deadline(ctx, overrides, defn))
    if record.verdict is None:
        return GateDecision("park")
    if record.verdict.verdict != "approve":
        return GateDecision("deny", record.verdict.reason or "denied by reviewer")
    reason = None if _started(events, call_id, record.verdict.seq) else void_reason(events, record.verdict)
    if reason is not None:
        voided = {"call_id": call_id, "request_seq": record.seq, "verdict_seq": record.verdict.seq, "reason": reason}
        if record.verdict.by:
            voided["by"] = record.verdict.by
        return GateDecision("ask", reason, deadline=_deadline(ctx, overrides, defn), voided=voided)
    return GateDecision("run", args=record.verdict.edited_args)


def void_reason(events: list[LoggedEvent], verdict: Verdict) -> str | None:
    """Why an approval no longer stands (None: it does): the session was
    revoked after it, or its reviewer lost the authority it rested on."""
    if any(e.kind == "session/revoked" and e.seq > verdict.seq for e in events):
        return "session_revoked"
    grounds = verdict.grounds or {}
    users = get_user_model().objects.all()
    if isinstance(grounds.get("user_id"), int):
        user = users.filter(pk=grounds["user_id"]).first()
    else:  # a verdict from before grounds were recorded: its reviewer by name
        user = users.filter(**{users.model.USERNAME_FIELD: verdict.by}).first() if verdict.by else None
    return lapsed(verdict.grounds, user)


def waiver_lapsed(ctx: CallContext | None, defn: Definition) -> str | None:
    """Why a waiver of `defn` no longer stands (None: it does): the reviewer
    who allowed the tool for the session lost the authority it rested on, as
    an approval's would (a waiver is a standing grant, so it is held to the
    same rule at every call). A waiver recorded before grants were is kept."""
    if ctx is None:
        return None
    grant = waiver_grant(ctx.session_id, ctx.policy_seq, defn.name)
    if grant is None or not isinstance(grant.get("user_id"), int):
        return None
    return lapsed(grant, get_user_model().objects.filter(pk=grant["user_id"]).first())


def _started(events: list[LoggedEvent], call_id: str, verdict_seq: int) -> bool:
    """Has the approved call's first attempt been committed (the grant used)?"""
    return any(e.kind == "tool/attempt" and e.seq > verdict_seq and e.data["call_id"] == call_id for e in events)


def _waived(ctx: CallContext | None, defn: Definition) -> bool:
    """Has a reviewer allowed this tool for the rest of the session? Judged by
    the policy in force as of the runner's commit right before the veto."""
    if ctx is None or not ctx.policy_known:
        return False
    return auto_approved(ctx.session_id, ctx.policy_seq, defn.name)


def request(
    session_id: uuid.UUID,
    fence: log.Fence | None,
    call_id: str,
    name: str,
    args: dict[str, Any],
    *,
    decision: GateDecision | None = None,
) -> bool:
    """Append approval/requested unless the turn is being cancelled; with
    the `decision` that asked, its clock (`deadline`) and, for a void
    approval, the approval/voided before it.

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
        if decision is not None and decision.voided is not None:
            tx.append("approval/voided", decision.voided)
        data: dict[str, Any] = {"call_id": call_id, "name": name, "args": args}
        if decision is not None and decision.deadline is not None:
            data["deadline"] = decision.deadline
        tx.append("approval/requested", data)
    return True
