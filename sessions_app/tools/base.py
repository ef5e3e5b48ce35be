"""Tool definitions and the per-profile registry."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Approval = Literal["never", "policy", "always"]
# What a resume may do with a call whose attempt has no recorded outcome
# (its worker died between the intent and the result): see docs/tools.md.
Replay = Literal["safe", "reconcile", "never"]
REPLAYS: tuple[Replay, ...] = ("safe", "reconcile", "never")


class ToolError(Exception):
    """A tool failed in a way the model should see as an error result."""


@dataclass(frozen=True)
class ToolContext:
    session_id: uuid.UUID
    call_id: str
    workspace: Path  # per-session sandbox directory (created on demand)
    # Stable for the call across attempts and workers, so a target can
    # deduplicate: the same key on every attempt of one call, a different
    # key for every other call. Empty only outside a turn (tests, tools run by hand).
    idempotency_key: str = ""
    attempt: int = 0  # 1 for the first attempt of the call, 2 for the next
    fence: int = 0  # the lease generation the attempt runs under


Handler = Callable[[ToolContext, dict[str, Any]], str]


@dataclass(frozen=True)
class Reconciliation:
    """What a tool's target says about an attempt whose outcome was not
    recorded: `done` (with the result the model will see), `not_done` (the
    effect did not happen: run it), or `unknown` (an operator decides)."""

    state: Literal["done", "not_done", "unknown"]
    result: str = ""


# Asks the target what happened to the attempt in `ctx` with these arguments.
Reconciler = Callable[[ToolContext, dict[str, Any]], Reconciliation]


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
    # The replay policy as declared; None derives it (see `replay_policy`).
    replay: Replay | None = None
    reconcile: Reconciler | None = None
    # The call may park its turn (task.start in the foreground, task.wait): the
    # runtime carries it out itself (runtime/owned/waits.py), never `handler`.
    parks: bool = False

    @property
    def runs_inline(self) -> bool:
        """In-process, fast, read-only and idempotent (a clock, a file read):
        the turn runner commits nothing before running one, and its assistant
        message and result are committed with the step's tail. A crash in that
        window re-asks the model, as a crash mid-stream would, and running it
        again could not have harmed anything."""
        return self.in_process and self.fast and not self.mutating and self.idempotent

    @property
    def replay_policy(self) -> Replay:
        """Declared, or derived: a reconcile hook makes it `reconcile`; a tool
        that changes nothing, or whose repeat has the effect of one run, is
        `safe`; every other mutating tool is `never`. A declared `reconcile`
        without a hook counts as `never`."""
        if self.replay == "reconcile" and self.reconcile is None:
            return "never"
        if self.replay is not None:
            return self.replay
        if self.reconcile is not None:
            return "reconcile"
        return "safe" if not self.mutating or self.idempotent else "never"
