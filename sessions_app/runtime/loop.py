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
from sessions_app.listeners import TurnFacts
from sessions_app.llm.types import ModelError, ModelReply, ToolCall
from sessions_app.log import AppendedEvent, LeaseLost
from sessions_app.models import AgentProfile
from sessions_app.projection import render
from sessions_app.runtime import hooks
from sessions_app.runtime import lease as leases
from sessions_app.runtime.models import resolve_spec
from sessions_app.selectors import LoggedEvent, events_since, pending_inputs, turn_view
from sessions_app.tools.base import Definition, ToolContext

logger = logging.getLogger(__name__)

MAX_STEPS = 25
RESUME_BACKOFF_SECONDS = 30.0
REFRESH_PAGE = 1000
DEFAULT_SYSTEM_PROMPT = "You are an agent running inside Terret. Use the tools you are given when they help."


def drive(session_id: uuid.UUID | str) -> str:
    """Drive a session until nothing is owed. Returns what happened last:
    busy, idle, ended, parked, lost, resume_failed or no_agent."""
    sid = uuid.UUID(str(session_id))
    outcome = "idle"
    ended: TurnFacts | None = None
    try:
        outcome, ended = _drive(sid)
    finally:
        if ended is not None and settings.TERRET_WORKER != "manual":
            _post_turn(sid, ended)
    return outcome


def _post_turn(sid: uuid.UUID, facts: TurnFacts) -> None:
    from sessions_app.listeners import post_turn

    try:
        post_turn(sid, facts)
    except Exception:
        logger.exception("post-turn work for %s failed", sid)


def _drive(sid: uuid.UUID) -> tuple[str, TurnFacts | None]:
    outcome = "idle"
    ended: TurnFacts | None = None
    # Re-check after releasing: a wake-up that arrived while we held the lease
    # found it busy and left, so its work is ours to notice. "parked" is not
    # final for the same reason: a verdict may have landed meanwhile.
    for _ in range(100):
        lease = leases.claim(sid)
        if lease is None:
            return "busy", ended
        head: leases.Head | None = None
        runner: TurnRunner | None = None
        try:
            outcome, runner = _drive_with_lease(sid, lease)
        except LeaseLost:
            outcome = "lost"
        finally:
            if runner is not None and runner.released is not None:
                head = runner.released  # its last commit gave the lease up
            else:
                retry_after = RESUME_BACKOFF_SECONDS if outcome == "resume_failed" else None
                head = leases.release(lease, retry_after=retry_after)
        if outcome == "ended" and runner is not None:
            ended = runner.facts()
        if outcome in ("lost", "resume_failed", "no_agent") or head is None or not has_work(sid, head):
            return outcome, ended
    return outcome, ended


def has_work(session_id: uuid.UUID, head: leases.Head) -> bool:
    if head.open_turn_seq is not None:
        return head.pending_approvals == 0
    if not head.input_pending:
        return False
    return any(item.data.get("wake") for item in pending_inputs(session_id, head.inbox_seq))


def _drive_with_lease(sid: uuid.UUID, lease: leases.Lease) -> tuple[str, TurnRunner | None]:
    profile = lease.driving.profile
    if profile is None:
        return "no_agent", None
    turn_seq = lease.head.open_turn_seq
    if turn_seq is None:
        if not lease.head.input_pending:
            return "idle", None
        with log.locked(sid, fence=lease.fence) as tx:
            pending = pending_inputs(sid, tx.row["inbox_seq"])
            if not any(item.data.get("wake") for item in pending):
                return "idle", None
            from sessions_app.services import _open_turn

            turn_seq = _open_turn(tx, None, "")
            # The row as the turn opens, not as claimed: a policy or model
            # change in between precedes the turn, so load() would not see it.
            lease.driving = leases.driving_from_row(profile, tx.row)
    runner = TurnRunner(sid, profile, lease)
    return runner.run(turn_seq), runner


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
    """Runs one open turn.

    It reads the turn once, then keeps the turn's events and the model's
    message list in memory. What the turn appends is buffered and committed
    in one statement right before the next external effect (model call, tool
    run, parking, returning), so a step costs two commits: a crash loses only
    what was produced since the last external effect, which resume redoes
    (the same at-least-once window a crash before any append has). Foreign
    events (a cancel, queued input, a model change) are noticed when a batch's
    first seq is not the one after what this runner last saw; only then is
    the log re-read. Compaction cannot interleave: it declines while a turn
    is open."""

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
        self.buffer: list[tuple[str, dict[str, Any]]] = []
        # The session's policy head as of this runner's last commit: the claim
        # (or the turn's opening) gave it, and a foreign policy/updated shows
        # up at the next flush.
        self.policy_seq = lease.driving.policy_seq
        # Local calls whose results sit in the buffer, decided on the policy
        # head of the last commit without reading it: (buffer index of the
        # result, call, definition, args). The flush that commits them is
        # guarded on that head (see flush).
        self.decided: list[tuple[int, ToolCall, Definition, dict[str, Any]]] = []
        # The head as the turn/end commit left it, which also gave up the lease.
        self.released: leases.Head | None = None
        # For the post-turn work, so it need not read them back.
        self.first_user_text: str | None = None
        self.last_prompt_tokens: int | None = None

    # -- plumbing

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.buffer.append((kind, data))

    def flush(self, *, release: bool = False) -> list[AppendedEvent]:
        """Commit the buffer; catch up with foreign events if there were any.

        Buffered results of local calls were allowed or vetoed on the policy
        head of the previous commit, so the commit is guarded on that head: if
        a policy/updated landed meanwhile, nothing is written, the runner
        catches up and decides those calls again under the new policy (they
        are local and read-only, so running one again is harmless), and
        retries. Either way every call in the log was judged by the policy
        that precedes it there.

        With `release`, the commit also gives up the lease (the turn's last)."""
        while self.buffer:
            guard = ("policy_at", self.policy_seq or 0) if self.decided else None
            if release:
                appended, head = log.append_releasing(self.sid, self.buffer, fence=self.lease.fence, guard=guard)
                if head is not None:
                    self.released = leases.released(self.lease, head)
            else:
                appended = log.append_many(self.sid, self.buffer, fence=self.lease.fence, guard=guard)
            if appended:
                break
            before = self.policy_seq
            self.refresh()
            if self.policy_seq == before:  # the guard failed on a head the log does not show
                raise RuntimeError(f"session {self.sid}: policy head moved without a policy/updated event")
            for at, call, defn, args in self.decided:
                self.buffer[at] = self.local_result(call, defn, args)
        else:
            return []
        self.buffer, self.decided = [], []
        if appended[0].seq == self.seen + 1:
            self.observe([LoggedEvent(e.seq, e.kind, e.data) for e in appended])
        else:
            self.refresh()
        return appended

    def refresh(self) -> None:
        """Catch up with everything committed after what this runner saw."""
        while True:
            new = events_since(self.sid, self.seen, limit=REFRESH_PAGE)
            self.observe(new)
            if len(new) < REFRESH_PAGE:
                return

    def observe(self, new: list[LoggedEvent]) -> None:
        for e in new:
            if e.kind in MODEL_VISIBLE and e.kind != "session/compacted":
                self.messages.append(render(e.kind, e.data))
            self.track(e)
        self.events.extend(new)
        if new:
            self.seen = new[-1].seq

    def track(self, e: LoggedEvent) -> None:
        """What the runner keeps of its turn's events besides the messages."""
        if e.kind == "model/updated" and e.data["role"] == "main":
            self.spec = e.data["spec"]
        elif e.kind == "step/end" and e.data.get("usage"):
            self.last_prompt_tokens = int(e.data["usage"].get("prompt_tokens", 0))
        elif e.kind == "policy/updated":
            self.policy_seq = e.seq

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
            self.track(e)

    def facts(self) -> TurnFacts:
        return TurnFacts(
            profile=self.profile,
            titled=self.lease.driving.titled,
            first_user_text=self.first_user_text,
            last_prompt_tokens=self.last_prompt_tokens,
            overrides=self.lease.driving.overrides,
        )

    def state(self) -> TurnState:
        """The turn as this runner knows it, buffered appends included (with
        provisional seqs after what it has seen)."""
        pending = [LoggedEvent(self.seen + i, k, d) for i, (k, d) in enumerate(self.buffer, start=1)]
        return TurnState.parse(self.events + pending)

    def end(self, status: str, error: str = "") -> str:
        self.emit("turn/end", {"status": status, "error": error} if error else {"status": status})
        self.flush(release=True)
        return "ended"

    # -- the turn

    def run(self, turn_seq: int) -> str:
        self.load(turn_seq)
        st = self.state()
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
                self.flush()
                self.drain_inbox()
                st = self.state()
            if st.max_step == 0 and not st.has_input:
                return self.end("empty")
            outcome = self.step(step, resuming)
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
        self.emit("step/end", end)
        return None

    def drain_inbox(self) -> None:
        """Queued input rides into the next step as context/injected."""
        with log.locked(self.sid, fence=self.lease.fence) as tx:
            for item in pending_inputs(self.sid, tx.row["inbox_seq"]):
                tx.append("context/injected", {"text": item.data["text"], "source_seq": item.seq})
        self.refresh()

    def step(self, step: int, resuming: bool) -> str | None:
        spec = self.spec
        self.emit("step/start", {"step": step, "model": spec})
        self.flush()  # with the previous step's tail: one commit before the model call
        st = self.state()
        if st.cancel_requested:
            return self.close_cancelled(st)
        if st.inbox_pending:
            self.drain_inbox()
            st = self.state()
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
        self.emit("assistant/message", _assistant_payload(reply))
        end: dict[str, Any] = {"step": step}
        if reply.usage is not None:
            end["usage"] = reply.usage.as_json()
        if not reply.tool_calls:
            self.emit("step/end", end)
            return self.end("completed")
        if all(self.is_local(call) for call in reply.tool_calls):
            # Nothing but local calls: no commit before them (see
            # Definition.local); the message keeps its provisional seq, the
            # last of the buffer's.
            message = LoggedEvent(self.seen + len(self.buffer), "assistant/message", self.buffer[-1][1])
        else:
            (appended,) = self.flush()[-1:]
            message = LoggedEvent(appended.seq, appended.kind, appended.data)
        # `st` predates this message, which is right: its calls have no
        # results or verdicts yet, and earlier verdicts of the turn are in it.
        if self.execute_calls(message, st) == "parked":
            return "parked"
        self.emit("step/end", end)
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

    def is_local(self, call: ToolCall) -> bool:
        """A call the runner makes without committing first: a local tool
        (Definition.local) that no approval setting makes ask."""
        defn = self.registry.get(call.name)
        return defn is not None and defn.local and not gate.needs_approval(defn, self.profile.approvals or {})

    def execute_calls(self, message: LoggedEvent, st: TurnState) -> str:
        parked = False
        for call in st.owed_calls(message):
            if self.run_call(call, st, message.seq) == "parked":
                parked = True
        if parked:
            self.flush()
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
        if self.is_local(call):
            # Decided on the policy head of the last commit, unread; the
            # commit of the result checks that head (see flush).
            self.decided.append((len(self.buffer), call, defn, args))
            self.buffer.append(self.local_result(call, defn, args))
            return "done"
        # Commit what is buffered first: the flush is also what reveals a
        # policy/updated committed meanwhile by anyone (a foreign event shows
        # up as a gap in the seqs), so the veto sees every update committed
        # before it without reading the session row itself.
        self.flush()
        veto = hooks.first_veto(self.call_context(defn, args))
        if veto:
            return self.result(call, f"vetoed: {veto}", True)
        # Verdicts bind to this call: same id, tool and args, asked after its message.
        decision = gate.check(st.events, defn, self.profile.approvals or {}, call.id, args, after_seq=message_seq)
        if decision.action == "ask":
            self.flush()  # the request's row-lock check must see everything before it
            if not gate.request(self.sid, self.lease.fence, call.id, call.name, args):
                # Cancelled meanwhile: asking now would leave a request no one denies.
                return self.result(call, "cancelled: the turn was cancelled", True)
            self.refresh()
            return "parked"
        if decision.action == "park":
            return "parked"
        if decision.action == "deny":
            return self.result(call, f"denied: {decision.reason}", True)
        return self.execute(defn, call)

    def call_context(self, defn: Definition, args: dict[str, Any]) -> hooks.CallContext:
        return hooks.CallContext(self.sid, self.profile, defn, args, policy_known=True, policy_seq=self.policy_seq)

    def local_result(self, call: ToolCall, defn: Definition, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The tool/result of a local call under the runner's policy head (a
        local call never asks for approval: see is_local)."""
        from sessions_app.tools.executor import execute

        veto = hooks.first_veto(self.call_context(defn, args))
        if veto:
            return _result(call, f"vetoed: {veto}", True)
        workspace = settings.TERRET_WORKSPACE_ROOT / self.sid.hex
        outcome = execute(defn, ToolContext(self.sid, call.id, workspace), call.arguments)
        return _result(call, outcome.content, outcome.is_error)

    def execute(self, defn: Definition, call: ToolCall) -> str:
        from sessions_app.tools.executor import execute

        self.flush()  # earlier results are durable before this tool runs
        connection.close()  # tools may be slow; hold no connection meanwhile
        workspace = settings.TERRET_WORKSPACE_ROOT / self.sid.hex
        outcome = execute(defn, ToolContext(self.sid, call.id, workspace), call.arguments)
        return self.result(call, outcome.content, outcome.is_error)

    def result(self, call: ToolCall, content: str, is_error: bool) -> str:
        self.buffer.append(_result(call, content, is_error))
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
            self.emit("step/end", {"step": st.open_step, "usage": usage} if usage else {"step": st.open_step})
        return self.end("cancelled")


def _result(call: ToolCall, content: str, is_error: bool) -> tuple[str, dict[str, Any]]:
    return "tool/result", {"call_id": call.id, "name": call.name, "content": content, "is_error": is_error}


def _assistant_payload(reply: ModelReply) -> dict[str, Any]:
    data: dict[str, Any] = {
        "content": reply.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
    }
    if reply.usage is not None:
        data["usage"] = reply.usage.as_json()
    return data
