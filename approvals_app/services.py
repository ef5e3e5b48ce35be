"""Writes on the approval side: a reviewer's verdict on a parked call.

One verdict per call: the check ("is this call still waiting?") and the
append happen under the session's row lock, so of two reviewers clicking at
once exactly one verdict lands and the other gets AlreadyDecided.

An approval may carry edited arguments (checked against the tool's schema
before the lock, bound to the exact request that was checked), and may allow
the tool for the rest of the session: the policy change and the verdict are
appended in one transaction under the same lock.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import jsonschema_rs
from django.conf import settings

from approvals_app.selectors import ApprovalRecord, approval_records, canonical, open_turn_approvals
from policies_app.services import allow_without_approval
from sessions_app import log
from sessions_app.errors import (
    AlreadyDecided,
    ApprovalExpired,
    InvalidInput,
    NotAllowed,
    TurnClosed,
    UnknownCall,
    UnknownSession,
)
from sessions_app.log import AppendedEvent
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.permissions import can_approve, grounds_of, is_reviewer
from sessions_app.runtime import dispatch
from sessions_app.tools.registry import registry_for_profile
from sessions_app.validation import clean_text, int_in_column

VERDICTS = ("approve", "deny")
MAX_REASON_CHARS = 2000
MAX_CALL_ID_CHARS = 200


def check_session_id(session_id: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(session_id))
    except ValueError:
        raise InvalidInput("session id must be a UUID") from None


def check_call_id(call_id: Any) -> str:
    if not isinstance(call_id, str) or not call_id.strip() or len(call_id) > MAX_CALL_ID_CHARS:
        raise InvalidInput(f"call id must be a non-empty string of at most {MAX_CALL_ID_CHARS} characters")
    return clean_text("call id", call_id)  # from a URL path, where %00 is a NUL; it reaches a query


def check_verdict(verdict: Any) -> str:
    if verdict not in VERDICTS:
        raise InvalidInput("verdict must be 'approve' or 'deny'")
    return str(verdict)


def check_reason(reason: Any) -> str:
    if reason is None:
        return ""
    reason = clean_text("reason", reason).strip()
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidInput(f"reason is longer than {MAX_REASON_CHARS} characters")
    return reason


def check_request_seq(seq: Any) -> int | None:
    if seq is None or seq == "":
        return None
    try:
        value = int(seq)
    except (TypeError, ValueError):
        raise InvalidInput("request seq must be a positive integer") from None
    if isinstance(seq, bool):
        raise InvalidInput("request seq must be a positive integer")
    return int_in_column("request seq", value, Event._meta.get_field("seq"), minimum=1)


def check_edited_args(edited: Any, verdict: str) -> dict[str, Any] | None:
    """The shape of an edit (a JSON object, approvals only, within the size
    a model's arguments may have); its schema is checked against the tool."""
    if edited is None:
        return None
    if verdict != "approve":
        raise InvalidInput("edited arguments go with an approval, not a denial")
    if not isinstance(edited, dict):
        raise InvalidInput("edited arguments must be a JSON object")
    limit = settings.TERRET_MAX_TOOL_ARGS_CHARS
    if len(canonical(edited)) > limit:
        raise InvalidInput(f"edited arguments are longer than {limit} characters")
    return edited


def parse_edited_args(text: Any) -> dict[str, Any] | None:
    """A form's edited-arguments field: blank is no edit; otherwise a JSON object."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        raise InvalidInput("edited arguments must be JSON text")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the edited arguments are not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(value, dict):
        raise InvalidInput("the edited arguments must be a JSON object")
    return value


def decide(
    session_id: uuid.UUID | str,
    call_id: str,
    verdict: str,
    *,
    user: Any,
    reason: str = "",
    request_seq: int | str | None = None,
    edited_args: dict[str, Any] | None = None,
    allow_for_session: bool = False,
) -> AppendedEvent:
    """Record `user`'s verdict on a call parked in the session's open turn.

    `request_seq` (the seq of the approval/requested the reviewer looked at)
    pins the verdict to that exact request: a call id reused in a later turn,
    with other arguments, is a different call and is not decided by a stale
    click. `edited_args` (approve only) replaces the model's arguments: they
    must validate against the tool's parameter schema, and they are what runs
    (an edit equal to the model's arguments is no edit). `allow_for_session`
    (approve only) also lets this tool run without asking for the rest of the
    session (a policy/updated in the same transaction). Raises InvalidInput,
    NotAllowed, UnknownSession, UnknownCall, TurnClosed, AlreadyDecided or
    ApprovalExpired (the request's deadline passed and denied it), appending
    nothing. On success appends approval/resolved (after the policy
    change, if any) and wakes a worker once it commits.
    """
    sid = check_session_id(session_id)
    call_id = check_call_id(call_id)
    verdict = check_verdict(verdict)
    reason = check_reason(reason)
    seq = check_request_seq(request_seq)
    edited = check_edited_args(edited_args, verdict)
    if allow_for_session not in (True, False):
        raise InvalidInput("allow_for_session must be true or false")
    if allow_for_session and verdict != "approve":
        raise InvalidInput("allowing a tool for the session goes with an approval, not a denial")
    if not is_reviewer(user):
        raise NotAllowed("deciding approvals needs the approve permission")
    session = Session.objects.filter(id=sid).only("id", "owner_id", "profile_id").first()
    if session is None:
        raise UnknownSession(f"no session {sid}")
    if not can_approve(user, session):
        raise NotAllowed("you may not decide approvals in this session")
    checked: ApprovalRecord | None = None
    if edited is not None:
        # Outside the lock: the tool's schema may come from an MCP server.
        checked = _open_request(sid, call_id, seq)
        edited = _validated_edit(session, checked, edited)
    by = user.get_username()
    with log.locked(sid) as tx:
        record = _waiting_request(tx, call_id, seq)
        if checked is not None and record.seq != checked.seq:
            raise AlreadyDecided(f"call {call_id} was asked again meanwhile; review the newer request")
        policy_seq = tx.row["policy_seq"]
        if allow_for_session:
            allow_without_approval(tx, record.name, by=by, grounds=grounds_of(user))
            policy_seq = next((e.seq for e in reversed(tx.appended) if e.kind == "policy/updated"), policy_seq)
        data: dict[str, Any] = {"call_id": call_id, "verdict": verdict}
        if reason:
            data["reason"] = reason
        if edited is not None:
            data["edited_args"] = edited
        data["by"] = by
        # What the verdict rests on: the gate checks it again before the call runs.
        data["grounds"] = {**grounds_of(user), "policy_seq": policy_seq}
        event = tx.append("approval/resolved", data)
        dispatch.wake(sid)  # after commit: a worker resumes the turn
    return event


def _open_request(sid: uuid.UUID, call_id: str, request_seq: int | None) -> ApprovalRecord:
    """The request an edit is checked against, read without the lock (the
    locked read then makes sure it is still the one waiting)."""
    turn_seq = Session.objects.filter(id=sid).values_list("open_turn_seq", flat=True).first()
    if turn_seq is not None:
        records = [
            r
            for r in approval_records(open_turn_approvals(sid, turn_seq))
            if r.call_id == call_id and r.open and request_seq in (None, r.seq)
        ]
        if records:
            return records[-1]
    with log.locked(sid) as tx:  # not waiting: the locked lookup names the reason (and raises)
        return _waiting_request(tx, call_id, request_seq)


def _validated_edit(session: Session, record: ApprovalRecord, edited: dict[str, Any]) -> dict[str, Any] | None:
    """`edited` if it validates against the tool's schema; None when it is the
    model's own arguments (no edit). InvalidInput naming the problems otherwise."""
    if canonical(edited) == canonical(record.args):
        return None
    profile = AgentProfile.objects.filter(pk=session.profile_id).first() if session.profile_id else None
    defn = registry_for_profile(profile).get(record.name) if profile is not None else None
    if defn is None:
        raise InvalidInput(f"the edit cannot be checked: the tool {record.name} is not available now")
    try:
        validator = jsonschema_rs.validator_for(defn.parameters, offline=True)
    except (ValueError, jsonschema_rs.ReferencingError):
        raise InvalidInput(f"the edit cannot be checked: {record.name}'s parameter schema is invalid") from None
    problems = []
    for error in validator.iter_errors(edited):
        where = "/".join(str(part) for part in error.instance_path) or "(root)"
        problems.append(f"{where}: {error.message[:200]}")
        if len(problems) == 3:
            break
    if problems:
        raise InvalidInput(f"the edited arguments do not fit {record.name}'s parameters: " + "; ".join(problems))
    return edited


def _waiting_request(tx: log.SessionTx, call_id: str, request_seq: int | None) -> ApprovalRecord:
    """The open turn's unsettled request for `call_id` (and `request_seq`), or the reason there is none."""
    turn_seq = tx.row["open_turn_seq"]
    if turn_seq is None:
        raise _missing(tx.session_id, call_id, request_seq, None)
    records = [r for r in approval_records(open_turn_approvals(tx.session_id, turn_seq)) if r.call_id == call_id]
    if request_seq is not None:
        records = [r for r in records if r.seq == request_seq]
    if not records:
        raise _missing(tx.session_id, call_id, request_seq, turn_seq)
    waiting = [r for r in records if r.open]
    if waiting:
        return waiting[-1]
    settled = records[-1].verdict
    if settled is None:  # superseded by a later request for the same call id
        raise AlreadyDecided(f"call {call_id} was asked again; decide the newer request")
    if settled.expired:
        raise ApprovalExpired(f"call {call_id} was not decided in time: {settled.reason}")
    who = f" by {settled.by}" if settled.by else ""
    raise AlreadyDecided(f"call {call_id} was already decided ({settled.verdict}{who})")


def _missing(sid: uuid.UUID, call_id: str, request_seq: int | None, turn_seq: int | None) -> Exception:
    """TurnClosed when the call was asked in a turn that has ended (ApprovalExpired
    when its request expired unanswered), else UnknownCall."""
    earlier = Event.objects.filter(session_id=sid, kind="approval/requested", data__call_id=call_id)
    if request_seq is not None:
        earlier = earlier.filter(seq=request_seq)
    if turn_seq is not None:
        earlier = earlier.filter(seq__lt=turn_seq)
    last = earlier.order_by("-seq").values_list("seq", flat=True).first()
    if last is not None:
        expired = Event.objects.filter(
            session_id=sid, kind="approval/expired", data__request_seq=last, data__on_expiry="deny"
        ).exists()
        if expired:  # its expiry denied it, and the turn went on without it
            return ApprovalExpired(f"call {call_id} was not decided in time: its request expired")
        return TurnClosed(f"call {call_id} belongs to a turn that has ended")
    return UnknownCall(f"no approval was requested for call {call_id} in the open turn")
