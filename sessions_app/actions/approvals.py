"""Approvals: a reviewer's verdict on a call that waits for one. The verb
returns a `Decision`; `Decision.as_json` is its one JSON shape (the API's
DecisionOut and the socket's ack)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals_app import services as approval_services
from sessions_app.actions.access import session_for


@dataclass(frozen=True)
class Decision:
    """The approval/resolved the verdict appended."""

    call_id: str
    verdict: str
    seq: int
    edited_args: dict[str, Any] | None
    allowed_for_session: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "verdict": self.verdict,
            "seq": self.seq,
            "edited_args": self.edited_args,
            "allowed_for_session": self.allowed_for_session,
        }


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
) -> Decision:
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
    return Decision(
        call_id=event.data["call_id"],
        verdict=event.data["verdict"],
        seq=event.seq,
        edited_args=event.data.get("edited_args"),
        allowed_for_session=allow_for_session,
    )
