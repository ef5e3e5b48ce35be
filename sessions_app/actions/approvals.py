"""Approvals: a reviewer's verdict on a call that waits for one."""

from __future__ import annotations

from typing import Any

from approvals_app import services as approval_services
from sessions_app.actions.access import session_for


def decide(
    user: Any,
    session_id: Any,
    call_id: str,
    verdict: str,
    reason: str | None = None,
    request_seq: int | None = None,
    *,
    edited_args: dict[str, Any] | None = None,
    allow_for_session: bool = False,
) -> dict[str, Any]:
    session = session_for(user, session_id, "approve")
    event = approval_services.decide(
        session.id,
        call_id,
        verdict,
        user=user,
        reason=reason or "",
        request_seq=request_seq,
        edited_args=edited_args,
        allow_for_session=allow_for_session,
    )
    return {
        "call_id": event.data["call_id"],
        "verdict": event.data["verdict"],
        "seq": event.seq,
        "edited_args": event.data.get("edited_args"),
        "allowed_for_session": allow_for_session,
    }
