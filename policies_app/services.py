"""Writes: a session's allow-list policy.

An update is one durable policy/updated append; it is in force at the very
next tool call, in every process (see policies_app.selectors).
"""

from __future__ import annotations

import uuid
from typing import Any

from policies_app.patterns import validate_patterns
from sessions_app import log
from sessions_app.errors import InvalidInput, NotAllowed, UnknownSession
from sessions_app.log import AppendedEvent
from sessions_app.models import Session
from sessions_app.permissions import can_drive


def update_policy(session_id: uuid.UUID | str, patterns: Any, *, user: Any) -> AppendedEvent:
    """Replace the session's allow-list with `patterns` (owner or staff).

    Raises InvalidPattern naming every bad pattern, NotAllowed or
    UnknownSession; nothing is appended then.
    """
    try:
        sid = uuid.UUID(str(session_id))
    except ValueError:
        raise InvalidInput("session id must be a UUID") from None
    if not (user and user.is_authenticated):
        raise NotAllowed("sign in to change a session's policy")
    session = Session.objects.filter(id=sid).only("id", "owner_id").first()
    if session is None:
        raise UnknownSession(f"no session {sid}")
    if not can_drive(user, session):
        raise NotAllowed("only the session's owner or staff may change its policy")
    clean = validate_patterns(patterns)
    return log.append(sid, "policy/updated", {"patterns": clean, "by": user.get_username()})
