"""Writes on the approval side: a reviewer's verdict on a parked call.

One verdict per call: the check ("is this call still waiting?") and the
append happen under the session's row lock, so of two reviewers clicking at
once exactly one verdict lands and the other gets AlreadyDecided.
"""

from __future__ import annotations

import uuid
from typing import Any

from approvals_app.selectors import ApprovalRecord, approval_records, open_turn_approvals
from sessions_app import log
from sessions_app.errors import AlreadyDecided, InvalidInput, NotAllowed, TurnClosed, UnknownCall, UnknownSession
from sessions_app.log import AppendedEvent
from sessions_app.models import Event, Session
from sessions_app.permissions import can_approve, is_reviewer
from sessions_app.runtime import dispatch

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
    return call_id


def check_verdict(verdict: Any) -> str:
    if verdict not in VERDICTS:
        raise InvalidInput("verdict must be 'approve' or 'deny'")
    return str(verdict)


def check_reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise InvalidInput("reason must be a string")
    reason = reason.strip()
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
    if isinstance(seq, bool) or value < 1:
        raise InvalidInput("request seq must be a positive integer")
    return value


def decide(
    session_id: uuid.UUID | str,
    call_id: str,
    verdict: str,
    *,
    user: Any,
    reason: str = "",
    request_seq: int | str | None = None,
) -> AppendedEvent:
    """Record `user`'s verdict on a call parked in the session's open turn.

    `request_seq` (the seq of the approval/requested the reviewer looked at)
    pins the verdict to that exact request: a call id reused in a later turn,
    with other arguments, is a different call and is not decided by a stale
    click. Raises InvalidInput, NotAllowed, UnknownSession, UnknownCall,
    TurnClosed or AlreadyDecided, appending nothing. On success appends
    approval/resolved and wakes a worker once it commits.
    """
    sid = check_session_id(session_id)
    call_id = check_call_id(call_id)
    verdict = check_verdict(verdict)
    reason = check_reason(reason)
    seq = check_request_seq(request_seq)
    if not is_reviewer(user):
        raise NotAllowed("deciding approvals needs the approve permission")
    session = Session.objects.filter(id=sid).only("id", "owner_id").first()
    if session is None:
        raise UnknownSession(f"no session {sid}")
    if not can_approve(user, session):
        raise NotAllowed("you may not decide approvals in this session")
    with log.locked(sid) as tx:
        _waiting_request(tx, call_id, seq)
        data: dict[str, Any] = {"call_id": call_id, "verdict": verdict}
        if reason:
            data["reason"] = reason
        data["by"] = user.get_username()
        event = tx.append("approval/resolved", data)
        dispatch.wake(sid)  # after commit: a worker resumes the turn
    return event


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
    who = f" by {settled.by}" if settled.by else ""
    raise AlreadyDecided(f"call {call_id} was already decided ({settled.verdict}{who})")


def _missing(sid: uuid.UUID, call_id: str, request_seq: int | None, turn_seq: int | None) -> Exception:
    """TurnClosed when the call was asked in a turn that has ended, else UnknownCall."""
    earlier = Event.objects.filter(session_id=sid, kind="approval/requested", data__call_id=call_id)
    if request_seq is not None:
        earlier = earlier.filter(seq=request_seq)
    if turn_seq is not None:
        earlier = earlier.filter(seq__lt=turn_seq)
    if earlier.exists():
        return TurnClosed(f"call {call_id} belongs to a turn that has ended")
    return UnknownCall(f"no approval was requested for call {call_id} in the open turn")
