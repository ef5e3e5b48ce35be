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
    # What a call of it does and costs, each said on its own:
    mutating: bool = False  # it changes something (a file, a remote state)
    idempotent: bool = True  # running it twice has the effect of running it once
    in_process: bool = False  # it runs inside the worker (not an MCP server, not the network)
    fast: bool = False  # it returns in about a millisecond and never waits on the outside world

    @property
    def runs_inline(self) -> bool:
        """In-process, fast, read-only and idempotent (a clock, a file read):
        the turn runner commits nothing before running one, and its assistant
        message and result are committed with the step's tail. A crash in that
        window re-asks the model, as a crash mid-stream would, and running it
        again could not have harmed anything."""
        return self.in_process and self.fast and not self.mutating and self.idempotent
