"""Errors of the program interface and the one way they are rendered.

Every failure the HTTP API or the session socket reports is a TerretError
(or mapped to one here), so a client sees the same `code` on both doors.
Permission and lookup failures reuse approvals_app's codes (`not_allowed`,
`unknown_session`) so there is one vocabulary across the project.
"""

from __future__ import annotations

from typing import Any

from sessions_app.errors import NotAllowed, TerretError, UnknownSession

__all__ = [
    "BadFrame",
    "Busy",
    "CsrfFailed",
    "FrameTooLarge",
    "InvalidJson",
    "NotAllowed",
    "PathNotFound",
    "PayloadTooLarge",
    "Unauthenticated",
    "UnknownSession",
    "UnknownType",
    "as_error",
    "error_body",
]


class Unauthenticated(TerretError):
    code = "unauthenticated"
    status = 401


class CsrfFailed(TerretError):
    code = "csrf_failed"
    status = 403


class InvalidJson(TerretError):
    code = "invalid_json"
    status = 400


class PayloadTooLarge(TerretError):
    code = "payload_too_large"
    status = 413


class PathNotFound(TerretError):
    code = "not_found"
    status = 404


class BadFrame(TerretError):
    """A socket frame that is not a JSON object (or is binary)."""

    code = "invalid_frame"


class UnknownType(TerretError):
    code = "unknown_type"


class FrameTooLarge(TerretError):
    code = "frame_too_large"


class Busy(TerretError):
    """Too many frames waiting on one socket."""

    code = "busy"
    status = 429


class InternalError(TerretError):
    code = "internal_error"
    status = 500


def as_error(exc: BaseException) -> TerretError:
    """The TerretError a failure is reported as (every domain error is one,
    the log's refusals included). Anything else is a bug: the caller logs it;
    the client only learns `internal_error`."""
    if isinstance(exc, TerretError):
        return exc
    return InternalError("internal error")


def error_body(exc: TerretError) -> dict[str, Any]:
    return {"code": exc.code, "message": str(exc) or exc.code.replace("_", " ")}
