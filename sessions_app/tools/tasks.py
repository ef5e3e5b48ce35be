"""The agent's owned work: built-in tools task.start, task.wait, task.status
and task.cancel.

task.start and task.wait may park the turn until tasks settle, which only
the runtime can do (Definition.parks: runtime/owned/waits.py carries them
out, under the same veto and approval gate as any call). task.status and
task.cancel are ordinary calls; they reach the runtime's task store through
a backend it registers at start-up (the tools room sits below it), the way
the schedule tools reach their service.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Protocol

from sessions_app.errors import TerretError

from .base import Definition, ToolContext, ToolError


class Tasks(Protocol):
    def status(self, session_id: uuid.UUID, task_id: str) -> dict[str, Any]: ...

    def cancel(self, session_id: uuid.UUID, task_id: str, *, by: str) -> dict[str, Any]: ...


_backend: Tasks | None = None


def register(backend: Tasks) -> None:
    global _backend
    _backend = backend


def _tasks() -> Tasks:
    if _backend is None:
        raise ToolError("tasks are not available in this process")
    return _backend


def _parks(ctx: ToolContext, args: dict[str, Any]) -> str:
    raise ToolError("this tool runs only inside a turn")  # the runtime carries it out (Definition.parks)


def _status(ctx: ToolContext, args: dict[str, Any]) -> str:
    try:
        return json.dumps(_tasks().status(ctx.session_id, args["task_id"]))
    except TerretError as exc:
        raise ToolError(str(exc)) from exc


def _cancel(ctx: ToolContext, args: dict[str, Any]) -> str:
    try:
        return json.dumps(_tasks().cancel(ctx.session_id, args["task_id"], by="agent"))
    except TerretError as exc:
        raise ToolError(str(exc)) from exc


_TASK_ID = {"type": "object", "properties": {"task_id": {"type": "string", "minLength": 1}}, "required": ["task_id"]}
_START = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["command", "subagent"]},
        "argv": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "command: the program and its arguments (argv[0] must be allowed by the profile)",
        },
        "timeout_s": {"type": "number", "minimum": 1, "description": "command: wall-clock limit in seconds"},
        "profile": {"type": "string", "description": "subagent: the profile of the child session"},
        "prompt": {"type": "string", "description": "subagent: its first user message"},
        "budget_usd": {"type": "number", "minimum": 0, "description": "subagent: reserved from your own budget"},
        "background": {
            "type": "boolean",
            "description": "false (default): wait for its outcome now; true: go on, and be told when it ends",
        },
    },
    "required": ["kind"],
    "additionalProperties": False,
}

DEFINITIONS = (
    Definition(
        "task.start",
        "Start owned work that may outlive this turn: a `command` (argv, run in your workspace with a timeout) "
        "or a `subagent` (a child session of a named profile, given `prompt`). With background false the call "
        "returns the task's outcome when it ends; with background true it returns {task_id} at once and you "
        "receive a message when the task ends.",
        _START,
        _parks,
        approval="policy",
        mutating=True,
        idempotent=True,  # keyed on the call: a resumed call finds the task its first attempt made
        in_process=True,
        replay="safe",
        parks=True,
    ),
    Definition(
        "task.wait",
        "Wait for tasks started earlier (by id) to end; returns each one's outcome (with timeout_s: each one's "
        "state when the time is up, the live ones going on).",
        {
            "type": "object",
            "properties": {
                "task_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 32},
                "timeout_s": {"type": "number", "minimum": 1, "description": "stop waiting after this many seconds"},
            },
            "required": ["task_ids"],
            "additionalProperties": False,
        },
        _parks,
        in_process=True,
        parks=True,
    ),
    Definition(
        "task.status",
        "A task's kind, phase, age, output so far and outcome.",
        _TASK_ID,
        _status,
        in_process=True,
    ),
    Definition(
        "task.cancel",
        "Cancel a task of this session: its process group is killed, a subagent's turns and tasks are cancelled.",
        _TASK_ID,
        _cancel,
        approval="policy",
        mutating=True,
        idempotent=True,
        in_process=True,
        replay="safe",
    ),
)
