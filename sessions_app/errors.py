"""Every domain error of Terret, in one module.

Each `TerretError` has a stable `code` and HTTP `status`, which the JSON API
and the socket frames render the same way, with the errors of the protocol
itself (bad JSON, a frame too large, no token) at the end of this module.
Every domain error a client can cause is a TerretError, so every door (API,
sockets, pages, /lg/) maps it to its status and code without a list of its
own. The log's refusals (an unknown kind, a bad payload, a missing session)
are TerretErrors too, and stay ValueError / LookupError for the code that
catches them as such; a superseded lease and an attempt to change an event
are not: no client causes them, and a door answers them 500.

This module imports nothing of the project, so every layer may import it;
approvals_app and policies_app have no errors module of their own.
"""

from __future__ import annotations

from typing import Any


class TerretError(Exception):
    code = "error"
    status = 400


# ---------------------------------------------------------------- the log


class UnknownEventKind(TerretError, ValueError):
    """The log's catalogue has no such kind; nothing was written."""

    code = "unknown_event_kind"
    status = 400


class InvalidPayload(TerretError, ValueError):
    """The payload does not match its kind's schema (or holds a NUL or a lone
    surrogate, or is too large); nothing was written."""

    code = "invalid_payload"
    status = 400


class SessionNotFound(TerretError, LookupError):
    """The log has no such session (the same code as UnknownSession)."""

    code = "unknown_session"
    status = 404


class LeaseLost(RuntimeError):
    """The caller's lease generation is no longer current: another worker owns the session."""


class TurnAlreadyOpen(RuntimeError):
    """A batch holding turn/start met a session whose turn is still open: the
    log keeps at most one turn open, and refused it (nothing was written).
    Whoever meant to open a turn queues behind the open one instead."""


class ImmutableEventError(RuntimeError):
    """Events are append-only: they can be neither changed nor deleted."""


# ---------------------------------------------------------------- the domain


class InvalidInput(TerretError):
    code = "invalid_input"
    status = 400


class AgentExists(TerretError):
    code = "agent_exists"
    status = 409


class AgentCapExceeded(TerretError):
    code = "agent_cap_exceeded"
    status = 429


class AgentBusy(TerretError):
    code = "agent_busy"
    status = 409


class NoAgent(TerretError):
    code = "no_agent"
    status = 409


class TurnAlreadyRunning(TerretError):
    code = "turn_already_running"
    status = 409


class NotBlocked(TerretError):
    """Retry asks a blocked turn to run again; this session's turn is not blocked."""

    code = "not_blocked"
    status = 409


class NoProfile(TerretError):
    """The session names no agent profile, so no agent can be spawned for it."""

    code = "no_profile"
    status = 409


class TurnOpenInLog(TerretError):
    code = "turn_open_in_log"
    status = 409


class InboxFull(TerretError):
    """The session's waiting input is at its bound (the profile's
    max_waiting_inputs / max_waiting_bytes): nothing was written. The
    input is admitted once turns take in what waits."""

    code = "inbox_full"
    status = 409


class StorageCorrupt(TerretError):
    """A cold session's archive fails its checksum: nothing was restored,
    and the session stays cold until an operator looks (docs/storage.md)."""

    code = "storage_corrupt"
    status = 500


class StorageBusy(TerretError):
    """The session cannot move cold now: a turn is open, input waits, or an
    approval is pending (docs/storage.md, "Tiering")."""

    code = "storage_busy"
    status = 409


class IdempotencyConflict(TerretError):
    code = "idempotency_conflict"
    status = 409


# -- permissions and lookups (one vocabulary for every door)


class NotAllowed(TerretError):
    """The user may not do this to this session (or is not signed in)."""

    code = "not_allowed"
    status = 403


class UnknownSession(TerretError):
    code = "unknown_session"
    status = 404


# -- approvals


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


class ApprovalExpired(TerretError):
    """The request's approval deadline passed and its expiry denied the call
    (approval/expired): a verdict now comes too late. Nothing was appended."""

    code = "approval_expired"
    status = 409


# -- operators


class SessionRevoked(TerretError):
    """An operator revoked the session: it takes no input until a staff member restores it."""

    code = "session_revoked"
    status = 409


class NotAbandonable(TerretError):
    """Abandon closes a blocked turn; this session has none, or a worker holds it."""

    code = "not_abandonable"
    status = 409


# -- the effect ledger


class UnknownEffect(TerretError):
    """No attempt of this call is on record in this session."""

    code = "unknown_effect"
    status = 404


class EffectNotPending(TerretError):
    """The call has no attempt of unknown outcome left to resolve (it has its
    outcome, or someone resolved it first), or the action cannot apply."""

    code = "effect_not_pending"
    status = 409


# -- input lanes and schedules


class UnknownInput(TerretError):
    """No input of this session has this seq (an input/queued, input/deferred, or a turn-opening message)."""

    code = "unknown_input"
    status = 404


class InputConsumed(TerretError):
    """The input was already taken into the transcript: a consumed observation cannot be withdrawn."""

    code = "input_consumed"
    status = 409


class UnknownSchedule(TerretError):
    code = "unknown_schedule"
    status = 404


class UnknownMonitor(TerretError):
    code = "unknown_monitor"
    status = 404


class TimeOutOfRange(InvalidInput):
    """A schedule's time lies outside the range a schedule may name: more than
    TERRET_SCHEDULE_HORIZON_DAYS from now either way, or one no datetime can
    hold (before year 1 or after 9999 in UTC). Refused at every door alike."""

    code = "time_out_of_range"
    status = 400


class ScheduleLimit(TerretError):
    """The profile bounds how many schedules a session may hold and how often one may recur."""

    code = "schedule_limit"
    status = 422


# -- policies


class InvalidPattern(InvalidInput):
    code = "invalid_pattern"
    status = 400


# -- compaction


class SummarizerNotConfigured(TerretError):
    code = "summarizer_not_configured"
    status = 409


class SummarizerFailed(TerretError):
    code = "summarizer_failed"
    status = 502


# -- outbound URLs


class UnsafeUrl(InvalidInput):
    """An outbound URL (a webhook's) that is malformed, not http(s), or whose
    host is or resolves to a private, loopback or link-local address that the
    setting TERRET_ALLOW_PRIVATE_HOSTS does not name (sessions_app/outbound.py)."""

    code = "unsafe_url"


class DefinitionMissing(TerretError):
    """Something a turn needs that the running code or the turn's definition
    no longer provides: a summarizer, a model role. `what` names it as a
    blocked turn does ("summarizer:<name>", "role:<role>"); the runner blocks
    the turn `definition_missing` on it rather than failing it."""

    code = "definition_missing"
    status = 409

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


# -- forks


class InvalidForkPoint(TerretError):
    """A fork was asked at a seq that is no fork point (inside a step, past
    the head, inside a fork's seed). `before` / `after` are the nearest fork
    points on either side (None: there is none yet), named in the message."""

    code = "invalid_fork_point"
    status = 422

    def __init__(self, message: str, *, at_seq: int, before: int | None, after: int | None) -> None:
        super().__init__(message)
        self.at_seq = at_seq
        self.before = before
        self.after = after


# -- agent versions


class UpgradeRefused(TerretError):
    """An upgrade of a session to another agent version would strand
    something of its open turn (an owed call or a pending approval whose tool
    the target lacks or whose arguments its schema rejects) or would move a
    turn a worker is driving right now; nothing changed. `reasons` says what,
    one sentence each."""

    code = "upgrade_refused"
    status = 409

    def __init__(self, message: str, *, reasons: list[str]) -> None:
        super().__init__(message)
        self.reasons = reasons


# -- documents


class UnknownDocument(TerretError):
    """The session has no such document (or no such version of it)."""

    code = "unknown_document"
    status = 404


class DocumentTooLarge(TerretError):
    """A write past a document's bound or the session's (profile fields
    max_document_bytes, max_session_document_bytes) or past max_documents;
    nothing was written."""

    code = "document_too_large"
    status = 413


class DocumentConflict(TerretError):
    """A write through a stale handle: the document's incarnation or version
    is no longer the one the writer read (it was recreated, or written
    meanwhile); nothing was written."""

    code = "document_conflict"
    status = 409


class DocumentVersionUnsupported(TerretError):
    """A typed read of a json document whose stored schema version is newer
    than this code knows, or older with no migration to the current one."""

    code = "document_version_unsupported"
    status = 422


# ---------------------------------------------------------------- the protocol (every door)


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
    """The one JSON rendering of an error: {code, message}, on every door."""
    return {"code": exc.code, "message": str(exc) or exc.code.replace("_", " ")}


# ---------------------------------------------------------------- owned work


class UnknownTask(TerretError):
    """No task of that id that the caller may see (runtime/owned/)."""

    code = "unknown_task"
    status = 404


class TaskRefused(InvalidInput):
    """A task.start the profile does not allow: a command whose argv[0] no
    command_allow pattern matches, a subagent past the depth or live-children
    bound. Nothing was started."""

    code = "task_refused"
    status = 422
