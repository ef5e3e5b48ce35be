"""The turn loop.

`drive(session_id)` is what a worker runs for a wake-up. Under the session
lease it opens a turn from queued wake input if the agent is idle, then runs
(or resumes) the open turn step by step until it ends, parks on an approval,
or loses its lease. All state comes from the log, so a fresh worker after a
kill -9 continues exactly where the dead one's last commit left off.

Rules kept here:
- Model calls and tool execution happen outside any transaction, with the
  database connection handed back to the pool first.
- Every append is fenced on the lease generation.
- A turn holds no worker while parked: the drive returns, and the commit of
  approval/resolved wakes a worker again.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection

from approvals_app import gate
from sessions_app import hints, log
from sessions_app.events import MODEL_VISIBLE
from sessions_app.llm.types import ModelError, ModelReply, ToolCall
from sessions_app.log import AppendedEvent, LeaseLost
from sessions_app.models import AgentProfile, Session
from sessions_app.projection import derive_messages, render
from sessions_app.runtime import hooks
from sessions_app.runtime import lease as leases
from sessions_app.runtime.models import resolve_spec
from sessions_app.selectors import LoggedEvent, agent_for_session, events_since, pending_inputs, turn_events
from sessions_app.tools.base import Definition, ToolContext

logger = logging.getLogger(__name__)

MAX_STEPS = 25
RESUME_BACKOFF_SECONDS = 30.0
DEFAULT_SYSTEM_PROMPT = "You are an agent running inside Terret. Use the tools you are given when they help."


def drive(session_id: uuid.UUID | str) -> str:
    """Drive a session until nothing is owed. Returns what happened last:
    busy, idle, ended, parked, lost, resume_failed or no_agent."""
    sid = uuid.UUID(str(session_id))
    outcome = "idle"
    # Re-check after releasing: a wake-up that arrived while we held the lease
    # found it busy and left, so its work is ours to notice.
    for _ in range(100):
        lease = leases.claim(sid)
        if lease is None:
            return "busy"
        retry_after: float | None = None
        try:
            outcome = _drive_with_lease(sid, lease)
        except LeaseLost:
            outcome = "lost"
        finally:
            if outcome == "resume_failed":
                retry_after = RESUME_BACKOFF_SECONDS
            leases.release(lease, retry_after=retry_after)
        # "parked" is not final: a verdict committed while we still held the
        # lease found it busy, so has_work (pending_approvals == 0) re-checks.
        if outcome in ("lost", "resume_failed", "no_agent") or not has_work(sid):
            return outcome
    return outcome


def has_work(session_id: uuid.UUID) -> bool:
    row = Session.objects.filter(id=session_id).values("open_turn_seq", "pending_approvals", "inbox_seq").first()
    if row is None:
        return False
    if row["open_turn_seq"] is not None:
        return bool(row["pending_approvals"] == 0)
    return any(item.data.get("wake") for item in pending_inputs(session_id, row["inbox_seq"]))


def _drive_with_lease(sid: uuid.UUID, lease: leases.Lease) -> str:
    agent = agent_for_session(sid)
    if agent is None:
        return "no_agent"
    with log.locked(sid, fence=lease.fence) as tx:
        if tx.row["open_turn_seq"] is None:
            pending = pending_inputs(sid, tx.row["inbox_seq"])
            if not any(item.data.get("wake") for item in pending):
                return "idle"
            from sessions_app.services import _open_turn

            _open_turn(tx, None, "")
    return TurnRunner(sid, agent.profile, lease).run()


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

    @classmethod
    def parse(cls, events: list[LoggedEvent]) -> TurnState:
        st = cls(events)
        for e in events:
            if e.kind == "step/start":
                st.max_step = max(st.max_step, e.data["step"])
                st.open_step, st.open_step_seq = e.data["step"], e.seq
            elif e.kind == "step/end" and e.data["step"] == st.open_step:
                st.open_step = None
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


class TurnRunner:
    """Runs one open turn. It reads the turn once and then only what is new
    (one bounded query per step), and keeps the model's message list in
    memory, extending it with each new model-visible event; compaction cannot
    interleave because it declines while a turn is open."""

    def __init__(self, session_id: uuid.UUID, profile: AgentProfile, lease: leases.Lease) -> None:
        from sessions_app.tools.registry import registry_for_profile

        self.sid = session_id
        self.profile = profile
        self.lease = lease
        self.registry = registry_for_profile(profile)
        self.events: list[LoggedEvent] = []
        self.seen = 0
        self.messages: list[dict[str, Any]] = []
        self.spec = ""

    # -- plumbing

    def append(self, kind: str, data: dict[str, Any]) -> AppendedEvent:
        return log.append(self.sid, kind, data, fence=self.lease.fence)

    def load(self) -> bool:
        turn_seq = Session.objects.filter(id=self.sid).values_list("open_turn_seq", flat=True).get()
        if turn_seq is None:
            return False
        self.events = turn_events(self.sid, turn_seq)
        self.seen = self.events[-1].seq if self.events else turn_seq
        self.messages = derive_messages(self.sid, until_seq=self.seen)
        self.spec = resolve_spec("main", self.profile, self.sid) or ""
        return True

    def state(self) -> TurnState:
        """Catch up with everything committed since the last look."""
        new = events_since(self.sid, self.seen)
        for e in new:
            if e.kind in MODEL_VISIBLE and e.kind != "session/compacted":
                self.messages.append(render(e.kind, e.data))
            elif e.kind == "model/updated" and e.data["role"] == "main":
                self.spec = e.data["spec"]
        self.events.extend(new)
        if new:
            self.seen = new[-1].seq
        return TurnState.parse(self.events)

    def end(self, status: str, error: str = "") -> str:
        self.append("turn/end", {"status": status, "error": error} if error else {"status": status})
        return "ended"

    # -- the turn

    def run(self) -> str:
        if not self.load():
            return "idle"
        st = TurnState.parse(self.events)
        resuming = st.max_step > 0
        if st.cancel_requested:
            return self.close_cancelled(st)
        if not resuming:
            reason = hooks.first_rejection(hooks.StepContext(self.sid, self.profile))
            if reason:
                return self.end("rejected", reason)
        if st.open_step is not None:
            outcome = self.close_open_step(st)
            if outcome is not None:
                return outcome
        while True:
            st = self.state()
            if st.cancel_requested:
                return self.close_cancelled(st)
            if self.lease.lost.is_set():
                return "lost"
            step = st.max_step + 1
            if step > MAX_STEPS:
                return self.end("failed", f"the turn exceeded {MAX_STEPS} steps")
            if st.inbox_pending:
                self.drain_inbox()
                st = self.state()
            if st.max_step == 0 and not st.has_input:
                return self.end("empty")
            outcome = self.step(step, resuming, st)
            if outcome is not None:
                return outcome

    def close_open_step(self, st: TurnState) -> str | None:
        """Resume inside a step: re-execute what its assistant message still
        owes (verdicts come from the log), then close it. A step that died
        before its assistant message stays unclosed; numbering continues."""
        message = st.assistant_in_open_step()
        if message is None or st.open_step is None:
            return None
        if self.execute_calls(message, st) == "parked":
            return "parked"
        end: dict[str, Any] = {"step": st.open_step}
        if message.data.get("usage"):
            end["usage"] = message.data["usage"]
        self.append("step/end", end)
        return None

    def drain_inbox(self) -> None:
        """Queued input rides into the next step as context/injected."""
        with log.locked(self.sid, fence=self.lease.fence) as tx:
            for item in pending_inputs(self.sid, tx.row["inbox_seq"]):
                tx.append("context/injected", {"text": item.data["text"], "source_seq": item.seq})

    def step(self, step: int, resuming: bool, st: TurnState) -> str | None:
        spec = self.spec
        self.append("step/start", {"step": step, "model": spec})
        messages = [{"role": "system", "content": self.profile.system_prompt or DEFAULT_SYSTEM_PROMPT}, *self.messages]
        try:
            reply = self.call_model(spec, messages, step)
        except ModelError as exc:
            if resuming:
                # A failed resume leaves the turn open: it still owes its
                # caller, and the outage is usually transient.
                logger.warning("resume of %s failed: %s", self.sid, exc)
                return "resume_failed"
            return self.end("failed", f"model call failed: {exc}")
        appended = self.append("assistant/message", _assistant_payload(reply))
        message = LoggedEvent(appended.seq, appended.kind, appended.data)
        # `st` predates this message, which is right: its calls have no
        # results or verdicts yet, and earlier verdicts of the turn are in it.
        if reply.tool_calls and self.execute_calls(message, st) == "parked":
            return "parked"
        end: dict[str, Any] = {"step": step}
        if reply.usage is not None:
            end["usage"] = reply.usage.as_json()
        self.append("step/end", end)
        if not reply.tool_calls:
            return self.end("completed")
        return None

    def call_model(self, spec: str, messages: list[dict[str, Any]], step: int) -> ModelReply:
        from sessions_app.llm.registry import get_adapter

        connection.close()  # no pooled connection is held across the model call
        adapter = get_adapter(spec)
        return adapter.complete(
            spec,
            messages,
            self.registry.specs(),
            on_delta=lambda text: hints.publish_delta(self.sid, {"step": step, "text": text}),
        )

    # -- tools

    def execute_calls(self, message: LoggedEvent, st: TurnState) -> str:
        parked = False
        for call in st.owed_calls(message):
            if self.run_call(call, st, message.seq) == "parked":
                parked = True
        return "parked" if parked else "done"

    def run_call(self, call: ToolCall, st: TurnState, message_seq: int = 0) -> str:
        defn = self.registry.get(call.name)
        if defn is None:
            return self.result(call, f"unknown tool {call.name!r}", True)
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            return self.result(call, "arguments are not valid JSON", True)
        if not isinstance(args, dict):
            return self.result(call, "arguments must be a JSON object", True)
        veto = hooks.first_veto(hooks.CallContext(self.sid, self.profile, defn, args))
        if veto:
            return self.result(call, f"vetoed: {veto}", True)
        # Verdicts bind to this call: same id, tool and args, asked after its message.
        decision = gate.check(st.events, defn, self.profile.approvals or {}, call.id, args, after_seq=message_seq)
        if decision.action == "ask":
            if not gate.request(self.sid, self.lease.fence, call.id, call.name, args):
                # Cancelled meanwhile: asking now would leave a request no one denies.
                return self.result(call, "cancelled: the turn was cancelled", True)
            return "parked"
        if decision.action == "park":
            return "parked"
        if decision.action == "deny":
            return self.result(call, f"denied: {decision.reason}", True)
        return self.execute(defn, call)

    def execute(self, defn: Definition, call: ToolCall) -> str:
        from sessions_app.tools.executor import execute

        workspace = settings.TERRET_WORKSPACE_ROOT / self.sid.hex
        connection.close()  # tools may be slow; hold no connection meanwhile
        outcome = execute(defn, ToolContext(self.sid, call.id, workspace), call.arguments)
        return self.result(call, outcome.content, outcome.is_error)

    def result(self, call: ToolCall, content: str, is_error: bool) -> str:
        self.append("tool/result", {"call_id": call.id, "name": call.name, "content": content, "is_error": is_error})
        return "done"

    # -- cancel

    def close_cancelled(self, st: TurnState) -> str:
        """End cancelled. Calls still owed get an error result first, so the
        projection never carries a tool call without its result."""
        for e in st.events:
            if e.kind == "assistant/message":
                for call in st.owed_calls(e):
                    self.result(call, "cancelled: the turn was cancelled", True)
        if st.open_step is not None:
            message = st.assistant_in_open_step()
            usage = message.data.get("usage") if message else None
            self.append("step/end", {"step": st.open_step, "usage": usage} if usage else {"step": st.open_step})
        return self.end("cancelled")


def _assistant_payload(reply: ModelReply) -> dict[str, Any]:
    data: dict[str, Any] = {
        "content": reply.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
    }
    if reply.usage is not None:
        data["usage"] = reply.usage.as_json()
    return data
