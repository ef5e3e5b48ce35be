"""Extension points of the turn loop.

pre_step hooks run once before a fresh turn's first step; a returned reason
rejects the turn (turn/end rejected). pre_execute hooks run for every tool call
before the approval gate, parent first in registration order; the first
returned reason vetoes the call, which the model sees as an error result.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessions_app.models import AgentProfile
from sessions_app.tools.base import Definition


@dataclass(frozen=True)
class StepContext:
    session_id: uuid.UUID
    profile: AgentProfile


@dataclass(frozen=True)
class CallContext:
    session_id: uuid.UUID
    profile: AgentProfile
    definition: Definition
    args: dict[str, Any]
    # The seq of the session's policy/updated in force (None: none yet), when
    # the caller knows it from its own latest commit (a turn runner: see
    # TurnRunner.flush for why that is enough); a caller that does not leaves
    # policy_known False and the policy is read.
    policy_known: bool = False
    policy_seq: int | None = None


PreStep = Callable[[StepContext], str | None]
PreExecute = Callable[[CallContext], str | None]

pre_step: list[PreStep] = []
pre_execute: list[PreExecute] = []


def register_pre_step(fn: PreStep) -> PreStep:
    if fn not in pre_step:
        pre_step.append(fn)
    return fn


def register_pre_execute(fn: PreExecute) -> PreExecute:
    if fn not in pre_execute:
        pre_execute.append(fn)
    return fn


def first_veto(ctx: CallContext) -> str | None:
    for fn in list(pre_execute):
        reason = fn(ctx)
        if reason:
            return reason
    return None


def first_rejection(ctx: StepContext) -> str | None:
    for fn in list(pre_step):
        reason = fn(ctx)
        if reason:
            return reason
    return None
