"""Writes: a session's allow-list policy.

An update is one durable policy/updated append; it is in force at the very
next tool call, in every process (see policies_app.selectors).
"""

from __future__ import annotations

import uuid
from typing import Any

from policies_app.patterns import validate_patterns
from policies_app.selectors import current_policy
from sessions_app import log
from sessions_app.errors import InvalidInput, NotAllowed, UnknownSession
from sessions_app.log import AppendedEvent
from sessions_app.models import Event, Session
from sessions_app.permissions import can_approve, can_drive


def _session_of(session_id: uuid.UUID | str, user: Any) -> tuple[uuid.UUID, Session]:
    """The session a signed-in user asks to change the policy of; the
    caller decides whether that user may."""
    try:
        sid = uuid.UUID(str(session_id))
    except ValueError:
        raise InvalidInput("session id must be a UUID") from None
    if not (user and user.is_authenticated):
        raise NotAllowed("sign in to change a session's policy")
    session = Session.objects.filter(id=sid).only("id", "owner_id").first()
    if session is None:
        raise UnknownSession(f"no session {sid}")
    return sid, session


def update_policy(session_id: uuid.UUID | str, patterns: Any, *, user: Any) -> AppendedEvent:
    """Replace the session's allow-list with `patterns` (owner or staff).

    Raises InvalidPattern naming every bad pattern, NotAllowed or
    UnknownSession; nothing is appended then.
    """
    sid, session = _session_of(session_id, user)
    if not can_drive(user, session):
        raise NotAllowed("only the session's owner or staff may change its policy")
    clean = validate_patterns(patterns)
    with log.locked(sid) as tx:
        data: dict[str, Any] = {"patterns": clean, "by": user.get_username()}
        _keep_waivers(data, _waivers(tx))  # a new allow-list keeps the reviewers' waivers
        return tx.append("policy/updated", data)


def _waivers(tx: log.SessionTx) -> dict[str, dict[str, Any] | None]:
    """The tools the policy in force lets run without asking, each with the
    grounds of the reviewer who allowed it (None for a waiver recorded before
    grants were), read under the row lock."""
    seq = tx.row["policy_seq"]
    if seq is None:
        return {}
    data = Event.objects.filter(session_id=tx.session_id, seq=seq).values_list("data", flat=True).first() or {}
    names = data.get("auto_approve") or []
    grants: dict[str, Any] = data["grants"] if isinstance(data.get("grants"), dict) else {}
    if not isinstance(names, list):
        return {}
    return {n: grants.get(n) for n in names if isinstance(n, str)}


def _keep_waivers(data: dict[str, Any], waivers: dict[str, dict[str, Any] | None]) -> None:
    if waivers:
        data["auto_approve"] = list(waivers)
        grants = {name: grant for name, grant in waivers.items() if grant is not None}
        if grants:
            data["grants"] = grants


def ask_again(session_id: uuid.UUID | str, tool: Any, *, user: Any) -> AppendedEvent:
    """Undo a reviewer's "allow for this session": `tool` asks for approval
    again from the next call (owner, staff, or a reviewer of the session).
    InvalidInput when the tool is not waived; nothing is appended then."""
    sid, session = _session_of(session_id, user)
    if not (can_drive(user, session) or can_approve(user, session)):
        raise NotAllowed("only the session's owner, staff or a reviewer may make a tool ask again")
    with log.locked(sid) as tx:
        waivers = _waivers(tx)
        if not isinstance(tool, str) or tool not in waivers:
            raise InvalidInput(f"{str(tool)[:100]!r} already asks for approval in this session")
        policy = current_policy(sid, known_seq=tx.row["policy_seq"])
        data: dict[str, Any] = {"patterns": list(policy.patterns), "by": user.get_username()}
        _keep_waivers(data, {n: g for n, g in waivers.items() if n != tool})
        return tx.append("policy/updated", data)


def allow_without_approval(
    tx: log.SessionTx, tool: str, *, by: str, grounds: dict[str, Any] | None = None
) -> AppendedEvent:
    """Within `tx` (the caller holds the row lock, e.g. a reviewer's verdict):
    append the policy in force again with `tool` added to the tools that run
    without asking for the rest of the session. The allow-list is unchanged;
    a session still on its profile's floor gets the floor as its own list.
    """
    seq = tx.row["policy_seq"]
    policy = current_policy(tx.session_id, known_seq=seq)
    if policy.source == "closed":
        raise InvalidInput("the session's policy cannot be read, so no tool can be allowed for it")
    waivers = _waivers(tx)
    waivers[tool] = grounds  # the newest grant of the tool is the one the gate checks
    data: dict[str, Any] = {"patterns": list(policy.patterns), "by": by}
    _keep_waivers(data, waivers)
    return tx.append("policy/updated", data)
