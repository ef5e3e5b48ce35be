"""The turn's view of the log: what a runner knows of its open turn.

It reads the turn once (`load`), then keeps the turn's events and the
model's message list in memory, extended by what the runner commits itself
(`observe`) and by foreign events when it has to catch up (`refresh`).
A compaction between turns cannot interleave (it declines while a turn is
open); one inside the turn is the runner's own doing, at a step boundary
(runner.py), and replaces the model's messages when the view observes it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sessions_app.llm.types import ToolCall
from sessions_app.log.catalogue import BUDGETS, MODEL_VISIBLE
from sessions_app.log.projection import render
from sessions_app.log.reads import events_since, turn_view
from sessions_app.log.records import LoggedEvent
from sessions_app.models import AgentProfile
from sessions_app.runtime.failures import CONTEXT_OVERFLOW, DEFINITION_MISSING
from sessions_app.runtime.lease import Lease
from sessions_app.runtime.roles import resolve_spec

REFRESH_PAGE = 1000


@dataclass
class TurnState:
    """The open turn, parsed from its events (bounded: one turn)."""

    events: list[LoggedEvent]
    max_step: int = 0
    open_step: int | None = None
    open_step_seq: int = 0
    cancel_requested: bool = False
    has_input: bool = False
    ended: bool = False
    results: dict[str, int] = field(default_factory=dict)
    consumed: set[int] = field(default_factory=set)
    queued: list[int] = field(default_factory=list)
    asked: set[str] = field(default_factory=set)
    # Calls with an attempt of unknown outcome that no operator resolved yet.
    unknown: set[str] = field(default_factory=set)
    # Failed attempts (turn/stalled, turn/blocked) since the turn last made progress.
    attempts: int = 0
    # The step a context_overflow or a definition_missing blocked: its requests
    # were refused, or its owed calls not started (nothing in flight that the
    # block did not leave in the ledger, nothing spent unrecorded), so driving
    # the turn again is no resume.
    refused_step: int | None = None

    @classmethod
    def parse(cls, events: list[LoggedEvent]) -> TurnState:
        st = cls(events)
        for e in events:
            if e.kind == "turn/start" and e.data.get("regenerate"):
                st.has_input = True  # it answers the history it opens on: no new input is owed
            elif e.kind == "step/start":
                st.max_step = max(st.max_step, e.data["step"])
                st.open_step, st.open_step_seq = e.data["step"], e.seq
            elif e.kind == "step/end":
                st.attempts = 0
                if e.data["step"] == st.open_step:
                    st.open_step = None
            elif e.kind == "turn/blocked" or (e.kind == "turn/stalled" and "attempt" in e.data):
                st.attempts += 1  # a stall of no progress ({since, phase}) is no failed attempt
                if e.data.get("code") in (CONTEXT_OVERFLOW, DEFINITION_MISSING):
                    st.refused_step = st.open_step
            elif e.kind == "approval/requested":
                st.asked.add(e.data["call_id"])
            elif e.kind == "tool/unknown":
                st.unknown.add(e.data["call_id"])
            elif e.kind == "tool/resolved":
                st.unknown.discard(e.data["call_id"])
            elif e.kind == "turn/cancel_requested":
                st.cancel_requested = True
            elif e.kind in ("user/message", "context/injected"):
                st.has_input = True
                if "source_seq" in e.data:
                    st.consumed.add(e.data["source_seq"])
            elif e.kind == "input/queued":
                st.queued.append(e.seq)
            elif e.kind == "tool/result":
                st.results[e.data["call_id"]] = e.seq
            elif e.kind == "turn/end":
                st.ended = True
        return st

    @property
    def reentry(self) -> bool:
        """Whether the turn is re-entered after a drive that did not finish
        its step (a crash, a lost lease, a database outage): a step is open
        and either its model call or one of its tool calls was in flight. A
        step whose owed calls all wait on (or got) a verdict, or on an
        operator, was parked, not interrupted: driving it again is no resume."""
        if self.open_step is None or self.open_step == self.refused_step:
            return False
        message = self.assistant_in_open_step()
        if message is None:
            return True
        waiting = self.asked | self.unknown
        return any(call.id not in waiting for call in self.owed_calls(message))

    def step_spend_known(self, step: int) -> bool:
        """Whether the spend of `step`'s model request is on record without a
        step/end: a usage/recorded of the step, or a stalled attempt after its
        step/start (whose failure recorded what the provider reported)."""
        if step == self.refused_step:
            return True  # refused as too long: a refusal is not billed
        start = next((e.seq for e in self.events if e.kind == "step/start" and e.data["step"] == step), 0)
        return any(
            (e.kind == "usage/recorded" and e.data.get("step") == step)
            or (e.kind == "turn/stalled" and "attempt" in e.data and e.seq > start)
            for e in self.events
        )

    @property
    def inbox_pending(self) -> bool:
        return any(seq not in self.consumed for seq in self.queued)

    def assistant_in_open_step(self) -> LoggedEvent | None:
        if self.open_step is None:
            return None
        found = None
        for e in self.events:
            if e.seq > self.open_step_seq and e.kind == "assistant/message":
                found = e
        return found

    def owed_calls(self, message: LoggedEvent) -> list[ToolCall]:
        """Tool calls of `message` with no tool/result after it."""
        return [
            ToolCall(c["id"], c["name"], c["arguments"])
            for c in message.data.get("tool_calls") or []
            if self.results.get(c["id"], 0) <= message.seq
        ]


class TurnView:
    """The open turn's events and the model's messages, as of `seen`."""

    def __init__(self, session_id: uuid.UUID, profile: AgentProfile, lease: Lease) -> None:
        self.sid = session_id
        self.profile = profile
        self.lease = lease
        self.events: list[LoggedEvent] = []
        self.seen = 0
        self.messages: list[dict[str, Any]] = []
        self.spec = ""
        # The seq of the policy/updated in force as of `seen` (None: none yet).
        self.policy_seq = lease.driving.policy_seq
        # Whether the session has a budget of its own, and an operator's holds
        # on it (as claimed, then as seen).
        self.budgeted = lease.driving.budgeted
        self.suspended = lease.driving.suspended
        self.revoked = lease.driving.revoked
        # For the post-turn work, so it need not read them back.
        self.first_user_text: str | None = None
        self.last_prompt_tokens: int | None = None

    def load(self, turn_seq: int) -> None:
        """The open turn and the model's view in one indexed read: from the
        latest compaction (its seq came with the lease), everything that is
        model-visible or in the turn."""
        driving = self.lease.driving
        start = driving.compacted_seq or 0
        self.messages = []
        self.events = []
        rows = self.lease.take_view(turn_seq)
        if rows is None:
            rows = turn_view(self.sid, start, turn_seq)
        for seq, kind, data in rows:
            if kind == "session/compacted":
                # The latest compaction replaces everything before it (one
                # may have landed between the claim and the turn's start).
                self.messages = [render(kind, data)]
            elif kind in MODEL_VISIBLE:
                self.messages.append(render(kind, data))
                if start == 0 and self.first_user_text is None and kind in ("user/message", "context/injected"):
                    self.first_user_text = str(data.get("text") or "").strip() or None
            if seq >= turn_seq:
                self.events.append(LoggedEvent(seq, kind, data))
        self.seen = self.events[-1].seq if self.events else turn_seq
        self.spec = resolve_spec("main", self.profile, overrides=driving.overrides) or ""
        self.policy_seq = driving.policy_seq
        for e in self.events:
            self._track(e)

    def refresh(self) -> None:
        """Catch up with everything committed after what this view saw."""
        while True:
            new = events_since(self.sid, self.seen, limit=REFRESH_PAGE)
            self.observe(new)
            if len(new) < REFRESH_PAGE:
                return

    def observe(self, new: list[LoggedEvent]) -> None:
        for e in new:
            if e.kind == "session/compacted":
                # Only a compaction inside this turn (compact_in_turn, at a step
                # boundary) can land while the turn runs: it replaces the view.
                self.messages = [render(e.kind, e.data)]
            elif e.kind in MODEL_VISIBLE:
                self.messages.append(render(e.kind, e.data))
            self._track(e)
        self.events.extend(new)
        if new:
            self.seen = new[-1].seq

    def _track(self, e: LoggedEvent) -> None:
        """What the view keeps of its turn's events besides the messages."""
        if e.kind == "model/updated" and e.data["role"] == "main":
            self.spec = e.data["spec"]
        elif e.kind == "step/end" and e.data.get("usage"):
            self.last_prompt_tokens = int(e.data["usage"].get("prompt_tokens", 0))
        elif e.kind == "policy/updated":
            self.policy_seq = e.seq
        elif e.kind == "budget/updated":
            self.budgeted = any(e.data[name] is not None for name in BUDGETS)
        elif e.kind in ("session/suspended", "session/resumed"):
            self.suspended = e.kind == "session/suspended"
        elif e.kind in ("session/revoked", "session/restored"):
            self.revoked = e.kind == "session/revoked"

    def state(self, pending: list[tuple[str, dict[str, Any]]]) -> TurnState:
        """The turn as known, with `pending` (buffered, uncommitted) events
        given provisional seqs after what was seen."""
        extra = [LoggedEvent(self.seen + i, k, d) for i, (k, d) in enumerate(pending, start=1)]
        return TurnState.parse(self.events + extra)
