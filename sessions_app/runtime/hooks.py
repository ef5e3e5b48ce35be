"""Extension points of the turn runner. The runtime calls them; the apps
that provide them register in their AppConfig.ready(), so the runtime
imports none of them:

- pre_step hooks run once before a fresh turn's first step; a returned
  reason rejects the turn (turn/end rejected).
- pre_execute hooks run for every tool call before the approval gate, in
  registration order; the first returned reason vetoes the call, which the
  model sees as an error result (policies_app's allow-list).
- the gate decides whether a call needs a human and parks it
  (approvals_app.gate); exactly one is registered.
- after_turn hooks run in the worker that ended a turn, after it released
  the lease (titling and the compaction trigger, sessions_app.services);
  a failing one is logged and does not affect the others.
- clocks run on every worker's clock thread, after its due schedules
  (runtime/schedules.py): the approval clock (approvals_app.deadlines); a
  failing one is logged and the thread goes on.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from sessions_app.log.records import Fence, LoggedEvent
from sessions_app.models import AgentProfile
from sessions_app.tools.base import Definition

logger = logging.getLogger(__name__)


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
    # runtime/outbox.py for why that is enough); a caller that does not
    # leaves policy_known False and the policy is read.
    policy_known: bool = False
    policy_seq: int | None = None


@dataclass(frozen=True)
class GateDecision:
    action: Literal["run", "deny", "park", "ask"]
    reason: str = ""
    # run: the arguments a reviewer approved in place of the model's (None: the model's own).
    args: dict[str, Any] | None = None
    # ask: the clock the request runs on (approval/requested's `deadline`; None: none).
    deadline: dict[str, Any] | None = None
    # ask: an approval found void, recorded (approval/voided) before asking again.
    voided: dict[str, Any] | None = None


class Gate(Protocol):
    def needs_approval(self, definition: Definition, overrides: dict[str, Any]) -> bool: ...

    def check(
        self,
        events: list[LoggedEvent],
        definition: Definition,
        overrides: dict[str, Any],
        call_id: str,
        args: Any,
        *,
        after_seq: int = 0,
        ctx: CallContext | None = None,
    ) -> GateDecision: ...

    def request(
        self,
        session_id: uuid.UUID,
        fence: Fence | None,
        call_id: str,
        name: str,
        args: dict[str, Any],
        *,
        decision: GateDecision | None = None,
    ) -> bool: ...


@dataclass(frozen=True)
class TurnFacts:
    """What the runner of a turn that just ended knows about its session.
    `titled` may be stale in one direction only (a title landed since the
    claim), which the guarded title append absorbs."""

    profile: AgentProfile
    titled: bool
    first_user_text: str | None = None
    last_prompt_tokens: int | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    # Whether any session waited for an agent slot as the turn's releasing
    # commit saw it (log.Workload.slots_wanted); None: not known.
    slots_wanted: bool | None = None

    @property
    def over_budget(self) -> bool | None:
        """None when the turn saw no step usage (the log decides then)."""
        if self.last_prompt_tokens is None:
            return None
        budget = self.profile.compaction_budget
        return bool(budget) and self.last_prompt_tokens >= budget


PreStep = Callable[[StepContext], str | None]
PreExecute = Callable[[CallContext], str | None]
AfterTurn = Callable[[uuid.UUID, TurnFacts], None]
# Compacts the open turn's session at a step boundary, under the turn's lease
# (session id, its fence, the turn's seq); None when it compacted, or why not.
Compactor = Callable[[uuid.UUID, Fence, int], "str | None"]

pre_step: list[PreStep] = []
pre_execute: list[PreExecute] = []
after_turn: list[AfterTurn] = []
_gate: list[Gate] = []
# Each returns how many events it appended.
clocks: list[Callable[[], int]] = []
_compactor: list[Compactor] = []


def register_pre_step(fn: PreStep) -> PreStep:
    if fn not in pre_step:
        pre_step.append(fn)
    return fn


def register_pre_execute(fn: PreExecute) -> PreExecute:
    if fn not in pre_execute:
        pre_execute.append(fn)
    return fn


def register_after_turn(fn: AfterTurn) -> AfterTurn:
    if fn not in after_turn:
        after_turn.append(fn)
    return fn


def register_clock(fn: Callable[[], int]) -> Callable[[], int]:
    if fn not in clocks:
        clocks.append(fn)
    return fn


def run_clocks() -> None:
    for fn in list(clocks):
        try:
            fn()
        except Exception:
            logger.exception("clock hook %s failed", fn)


def register_gate(gate: Gate) -> None:
    _gate[:] = [gate]


def gate() -> Gate:
    if not _gate:
        # Failing loudly beats running every call unasked.
        raise RuntimeError("no approval gate is registered (is approvals_app installed?)")
    return _gate[0]


def register_compactor(fn: Compactor) -> None:
    _compactor[:] = [fn]


def compact_in_turn(session_id: uuid.UUID, fence: Fence, turn_seq: int) -> str | None:
    """Compact now, inside the open turn; None when it did, else why not."""
    if not _compactor:
        return "no compactor is registered"
    return _compactor[0](session_id, fence, turn_seq)


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


def run_after_turn(session_id: uuid.UUID, facts: TurnFacts) -> None:
    for fn in list(after_turn):
        try:
            fn(session_id, facts)
        except Exception:
            logger.exception("after-turn hook %s failed for %s", fn, session_id)
