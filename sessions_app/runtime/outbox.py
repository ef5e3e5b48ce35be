"""The outbox: what a turn appends, buffered and committed in one statement
right before the next external effect (a model call, a tool run, parking,
returning).

A step therefore costs two commits, or one when it calls only inline tools
(tools.base.Definition.runs_inline), plus one per external tool call: its
intent (tool/attempt) is committed before it runs (runtime/effects.py). A crash loses only what was produced
since the last external effect, which resume redoes: the same
at-least-once window a crash before any append has.

Foreign events (a cancel, queued input, a policy or model change) are
noticed when a commit's first seq is not the one after what the view last
saw; only then is the log re-read.

The policy rule for inline calls is enforced here, and only here. An inline
call is allowed or vetoed on the policy in force as of the view's last
commit, without reading it; its result waits in the buffer. The commit that
carries such results is guarded on that policy (`policy_at`): if a
policy/updated landed meanwhile, nothing is written, the view catches up,
the calls are decided again under the new policy (they are inline, so
running one again is harmless) and the commit is retried. Every call in the
log is therefore judged by the policy that precedes it there. A call that
is not inline is judged after a commit, which reveals any policy/updated
committed before it as a seq gap.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessions_app import log
from sessions_app.errors import LeaseLost
from sessions_app.llm.types import ToolCall
from sessions_app.log.records import AppendedEvent, LoggedEvent, Workload
from sessions_app.runtime import lease as leases
from sessions_app.runtime.view import TurnState, TurnView
from sessions_app.tools.base import Definition

Entry = tuple[str, dict[str, Any]]
logger = logging.getLogger(__name__)
LOST_LEASE = "the lease was lost before the reply committed"


@dataclass(frozen=True)
class InlineCall:
    """An inline call whose result waits in the buffer at `at`."""

    at: int
    call: ToolCall
    definition: Definition
    args: dict[str, Any]


class Outbox:
    def __init__(self, session_id: uuid.UUID, lease: leases.Lease, view: TurnView) -> None:
        self.sid = session_id
        self.lease = lease
        self.view = view
        self.buffer: list[Entry] = []
        self.inline: list[InlineCall] = []
        # The workload as the turn's last commit left it, which also gave up the lease.
        self.released: Workload | None = None

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.buffer.append((kind, data))

    def emit_inline(self, call: ToolCall, definition: Definition, args: dict[str, Any], result: Entry) -> None:
        self.inline.append(InlineCall(len(self.buffer), call, definition, args))
        self.buffer.append(result)

    def record_spend(self) -> None:
        """The lease is gone, and with it this buffer: but the model requests
        it made were spent all the same. Record their usage without a fence
        (usage/recorded counts whoever holds the session now; the new holder
        redoes the step, and its own request counts on its own step/end)."""
        st = self.view.state(self.buffer)
        step = st.open_step or st.max_step or None  # the buffer may close the step it belongs to
        spend: list[Entry] = []
        for kind, data in self.buffer:
            if kind == "usage/recorded":
                spend.append((kind, data))
            elif kind == "assistant/message" and data.get("usage") is not None:
                entry = {"purpose": "step", "model": self.view.spec, "usage": data["usage"], "reason": LOST_LEASE}
                if step is not None:
                    entry["step"] = step
                spend.append(("usage/recorded", entry))
        if not spend:
            return
        try:
            log.append_many(self.sid, spend)
        except Exception:
            logger.exception("session %s: the spend of a lost lease could not be recorded", self.sid)

    def keep_storable(self) -> None:
        """Drop what the log would refuse from the buffer (a failing turn keeps
        the rest, and closes the turn after it)."""
        self.buffer = [(kind, data) for kind, data in self.buffer if log.refusal(kind, data) is None]
        self.inline = []

    def state(self) -> TurnState:
        """The turn as the runner knows it, buffered appends included."""
        return self.view.state(self.buffer)

    def provisional(self, offset: int) -> LoggedEvent:
        """The buffered entry at `offset` from the end (1: the last) with the seq it will get."""
        kind, data = self.buffer[-offset]
        return LoggedEvent(self.view.seen + len(self.buffer) - offset + 1, kind, data)

    def flush(self, redo: Callable[[InlineCall], Entry], *, release: bool = False) -> list[AppendedEvent]:
        """Commit the buffer (see the module docstring for the inline-call
        guard); `redo` decides an inline call again after a policy change.
        With `release`, the commit also gives up the lease (the turn's last)."""
        appended: log.Appended = log.Appended()
        while self.buffer:
            guard = ("policy_at", self.view.policy_seq or 0) if self.inline else None
            try:
                appended = log.append_many(self.sid, self.buffer, fence=self.lease.fence, guard=guard, release=release)
            except LeaseLost:
                self.record_spend()
                raise
            if appended:
                break
            before = self.view.policy_seq
            self.view.refresh()
            if self.view.policy_seq == before:  # the guard failed on a policy the log does not show
                raise RuntimeError(f"session {self.sid}: policy moved without a policy/updated event")
            for pending in self.inline:
                self.buffer[pending.at] = redo(pending)
        if not appended:
            return []
        if appended.workload is not None:
            self.released = leases.released(self.lease, appended.workload)
        self.buffer, self.inline = [], []
        if appended[0].seq == self.view.seen + 1:
            self.view.observe([LoggedEvent(e.seq, e.kind, e.data) for e in appended])
        else:
            self.view.refresh()
        return appended
