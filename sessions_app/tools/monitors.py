"""The agent's monitors: built-in tools monitor.create, monitor.list and
monitor.cancel, reaching sessions_app.services.monitors through the backend
it registers when the app is ready (as tools/schedules.py does). The
mutating two go under the session's approval policy; monitor.create is
keyed on the call's idempotency key (replay "safe")."""

from __future__ import annotations

import json
import uuid
from typing import Any, Protocol

from sessions_app.errors import TerretError

from .base import Definition, ToolContext, ToolError


class Monitors(Protocol):
    def create(self, session_id: uuid.UUID, spec: dict[str, Any], *, by: str, key: str) -> dict[str, Any]: ...

    def list(self, session_id: uuid.UUID) -> list[dict[str, Any]]: ...

    def cancel(self, session_id: uuid.UUID, monitor_id: str, *, by: str) -> dict[str, Any]: ...


_backend: Monitors | None = None


def register(backend: Monitors) -> None:
    global _backend
    _backend = backend


def _monitors() -> Monitors:
    if _backend is None:
        raise ToolError("monitors are not available in this process")
    return _backend


def _create(ctx: ToolContext, args: dict[str, Any]) -> str:
    try:
        made = _monitors().create(ctx.session_id, args, by="agent", key=ctx.idempotency_key or ctx.call_id)
    except TerretError as exc:
        raise ToolError(str(exc)) from exc
    return json.dumps(made)


def _list(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps(_monitors().list(ctx.session_id))


def _cancel(ctx: ToolContext, args: dict[str, Any]) -> str:
    try:
        return json.dumps(_monitors().cancel(ctx.session_id, args["monitor_id"], by="agent"))
    except TerretError as exc:
        raise ToolError(str(exc)) from exc


_CREATE = {
    "type": "object",
    "properties": {
        "schedule": {
            "type": "object",
            "properties": {
                "every_seconds": {"type": "integer", "minimum": 1},
                "cron": {"type": "string"},
                "misfire": {"enum": ["skip", "run_once", "reschedule"]},
            },
            "additionalProperties": False,
        },
        "sources": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["feed", "http_json", "mcp"]},
                    "url": {"type": "string"},
                    "partition": {"type": "string"},
                    "name": {"type": "string"},
                    "initial": {"enum": ["all", "now"]},
                },
                "required": ["kind"],
            },
        },
        "destination": {
            "type": "object",
            "description": '{"kind": "webhook", "url"}, {"kind": "email", "to": [..]} or {"kind": "session"}',
        },
        "quiet": {"enum": ["suppress", "send"]},
        "digest": {"enum": ["host", "model"], "description": "who writes each edition's digest"},
    },
    "required": ["schedule", "sources", "destination"],
    "additionalProperties": False,
}

DEFINITIONS = (
    Definition(
        "monitor.create",
        "Create a monitor of this session: on a schedule the host collects what is new in the sources (RSS or "
        "Atom feeds) and delivers a digest edition to the destination, each item version exactly once.",
        _CREATE,
        _create,
        approval="policy",
        mutating=True,
        idempotent=True,
        in_process=True,
        replay="safe",
    ),
    Definition(
        "monitor.list",
        "List this session's monitors with their coverage per source and their next due time.",
        {"type": "object", "properties": {}, "additionalProperties": False},
        _list,
        in_process=True,
    ),
    Definition(
        "monitor.cancel",
        "Cancel one of this session's monitors by its id.",
        {
            "type": "object",
            "properties": {"monitor_id": {"type": "string", "minLength": 1}},
            "required": ["monitor_id"],
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
