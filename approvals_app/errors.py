"""Approval and permission errors. Each is a TerretError, so the JSON API and
socket frames render them with a stable `code` and HTTP `status`."""

from __future__ import annotations

from sessions_app.errors import TerretError


class NotAllowed(TerretError):
    """The user may not do this to this session (or is not signed in)."""

    code = "not_allowed"
    status = 403


class UnknownSession(TerretError):
    code = "unknown_session"
    status = 404


class UnknownCall(TerretError):
    """No approval was ever requested for this call in this session."""

    code = "unknown_call"
    status = 404


class TurnClosed(TerretError):
    """The call was asked in a turn that has since ended; its approval is moot."""

    code = "turn_closed"
    status = 409


class AlreadyDecided(TerretError):
    """Someone else's verdict landed first. Nothing was appended."""

    code = "already_decided"
    status = 409
