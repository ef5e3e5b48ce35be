"""The agent's own wake-ups: built-in tools schedule.create, schedule.list
and schedule.cancel.

The tools room sits below the services that own schedules, so the tools
reach them through a backend that `sessions_app.services.schedules`
registers when the app is ready (the same shape as the runtime's hooks).
schedule.create is mutating, so the session's approval policy applies to it;
it is keyed on the call's idempotency key, so a re-run after a crash finds
the schedule its first attempt made instead of making a second one (replay
"safe"). The profile's bounds (how many schedules, the shortest interval)
are the service's to enforce, for people and agent alike.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Protocol

from sessions_app.errors import TerretError

from .base import Definition, ToolContext, ToolError


class Scheduler(Protocol):
    def create(self, session_id: uuid.UUID, spec: dict[str, Any], *, by: str, key: str) -> dict[str, Any]: ...

    def list(self, session_id: uuid.UUID) -> list[dict[str, Any]]: ...

    def cancel(self, session_id: uuid.UUID, schedule_id: str, *, by: str) -> dict[str, Any]: ...


_backend: Scheduler | None = None


def register(backend: Scheduler) -> None:
    global _backend
    _backend = backend


def _scheduler() -> Scheduler:
    if _backend is None:
        raise ToolError("schedules are not available in this process")
    return _backend


def _create(ctx: ToolContext, args: dict[str, Any]) -> str:
    try:
        made = _scheduler().create(ctx.session_id, args, by="agent", key=ctx.idempotency_key or ctx.call_id)
    except TerretError as exc:
        raise ToolError(str(exc)) from exc
    return json.dumps(made)


def _list(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps(_scheduler().list(ctx.session_id))


def _cancel(ctx: ToolContext, args: dict[str, Any]) -> str:
    try:
        return json.dumps(_scheduler().cancel(ctx.session_id, args["schedule_id"], by="agent"))
    except TerretError as exc:
        raise ToolError(str(exc)) from exc


_CREATE = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "minLength": 1, "description": "The message you will receive when it fires"},
        "due_at": {"type": "string", "description": "ISO 8601 time of the (first) wake-up, with a time zone"},
        "every_seconds": {"type": "integer", "minimum": 1, "description": "Repeat at this interval"},
        "cron": {"type": "string", "description": "Or repeat on this 5-field cron expression (UTC)"},
        "reason": {"type": "string", "maxLength": 200},
        "misfire": {"enum": ["skip", "run_once", "reschedule"]},
        "max_runs": {"type": "integer", "minimum": 1, "description": "Stop after this many runs"},
        "expires_at": {"type": "string", "description": "ISO 8601 time, with a time zone, to stop repeating at"},
    },
    "required": ["text"],
    "additionalProperties": False,
}

DEFINITIONS = (
    Definition(
        "schedule.create",
        "Schedule a wake-up of this session: at due_at, or repeating every_seconds or on a cron expression. "
        "When it fires you receive `text` as a new message in a turn of its own.",
        _CREATE,
        _create,
        approval="policy",
        mutating=True,
        idempotent=True,
        in_process=True,
        replay="safe",
    ),
    Definition(
        "schedule.list",
        "List this session's schedules with their status, next due time, runs and last outcome.",
        {"type": "object", "properties": {}, "additionalProperties": False},
        _list,
        in_process=True,
    ),
    Definition(
        "schedule.cancel",
        "Cancel one of this session's schedules by its id.",
        {
            "type": "object",
            "properties": {"schedule_id": {"type": "string", "minLength": 1}},
            "required": ["schedule_id"],
            "additionalProperties": False,
        },
        _cancel,
        approval="policy",
        mutating=True,
        idempotent=True,
        in_process=True,
        replay="safe",
    ),
)
