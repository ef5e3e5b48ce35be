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
