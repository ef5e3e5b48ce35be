"""Tool definitions and the per-profile registry."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Approval = Literal["never", "policy", "always"]


class ToolError(Exception):
    """A tool failed in a way the model should see as an error result."""


@dataclass(frozen=True)
class ToolContext:
    session_id: uuid.UUID
    call_id: str
    workspace: Path  # per-session sandbox directory (created on demand)


Handler = Callable[[ToolContext, dict[str, Any]], str]


@dataclass(frozen=True)
class Definition:
    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    approval: Approval = "never"
    mutating: bool = False
    idempotent: bool = True
    # A local call: fast, in-process, read-only and idempotent (a clock, a
    # file read). The turn runner commits nothing before running one; its
    # assistant message and result are committed with the step's tail. A
    # crash in that window re-asks the model, as a crash mid-stream would,
    # and running it again could not have harmed anything. Never for a tool
    # that changes anything, waits on the outside world, or asks a human.
    local: bool = False
