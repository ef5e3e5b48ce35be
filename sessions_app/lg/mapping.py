"""Terret's log read as LangGraph's threads, runs, messages and interrupts.

Pure functions over logged events (no database): the views, the state
reads and the SSE stream all fold events through one `Tracker`, so a run's
boundaries, its status and its interrupt are the same wherever they are
looked at. The rules are written down in docs/langgraph.md:

- a thread is a session, an assistant an agent profile;
- a run is a segment of a turn: it opens at `turn/start`, or at the verdict
  that settles the last parked call of an interrupt, and it ends at
  `turn/end` or at a park (every call of the step has a result or waits for
  a verdict, and at least one waits);
- a run id is uuid5(session id, "run:<seq that opened the segment>"), so it
  is the same in every process and after every restart; a turn opened from
  queued input (its user/message has source_seq) is opened by that input;
- the calls parked in one step are one interrupt, shaped like langchain's
  HumanInTheLoopMiddleware request: {action_requests, review_configs}.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from sessions_app.log.records import LoggedEvent

# The kinds a thread's state and runs are derived from (the rest of the log,
# usage, leases, titles, is not part of LangGraph's picture).
STATE_KINDS = (
    "turn/start",
    "turn/end",
    "turn/blocked",
    "turn/retry_requested",
    "turn/cancel_requested",
    "step/start",
    "user/message",
    "context/injected",
    "assistant/message",
    "tool/result",
    "approval/requested",
    "approval/resolved",
    "approval/expired",
)

THREAD_STATUS = {
    "idle": "idle",
    "running": "busy",
    "waiting_approval": "interrupted",
    "blocked": "error",
    # An attempt of unknown outcome waits for an operator: nothing a client can
    # resume, and nothing progresses by itself.
    "waiting_reconcile": "error",
}

# Terret's turn/end status -> LangGraph's run status.
RUN_STATUS = {
    "completed": "success",
    "empty": "success",
    "cancelled": "interrupted",
    "rejected": "error",
    "failed": "error",
}


def assistant_id(profile_name: str) -> str:
    """A profile's assistant id: stable, derived from its unique name."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"terret:profile:{profile_name}"))


def run_id(session_id: uuid.UUID | str, open_seq: int) -> str:
    return str(uuid.uuid5(uuid.UUID(str(session_id)), f"run:{open_seq}"))


def interrupt_id(session_id: uuid.UUID | str, first_request_seq: int) -> str:
    return uuid.uuid5(uuid.UUID(str(session_id)), f"interrupt:{first_request_seq}").hex


def checkpoint_id(seq: int) -> str:
    return f"seq-{seq}"


def parse_checkpoint_id(value: Any) -> int | None:
    """N for "seq-N" (N >= 0), else None."""
    if not isinstance(value, str) or not value.startswith("seq-"):
        return None
    digits = value[4:]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        return None
    return int(digits)


def ai_message_id(turn_seq: int | None, step: int) -> str:
    """Shared by a step's streamed chunks and its committed message, so a
    client merging chunks by id sees one message."""
    return f"ai-{turn_seq or 0}-{step}"


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"__raw__": raw}


def human_message(seq: int, text: str) -> dict[str, Any]:
    return {
        "type": "human",
        "content": text,
        "id": f"human-{seq}",
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
    }


def ai_message(event: LoggedEvent, turn_seq: int | None, step: int) -> dict[str, Any]:
    data = event.data
    calls = [
        {"name": c["name"], "args": _arguments(c.get("arguments")), "id": c["id"], "type": "tool_call"}
        for c in data.get("tool_calls") or []
    ]
    usage = data.get("usage") or None
    metadata: dict[str, Any] = {"seq": event.seq}
    if data.get("partial"):
        metadata["partial"] = True
    return {
        "type": "ai",
        "content": data.get("content") or "",
        "id": ai_message_id(turn_seq, step),
        "name": None,
        "tool_calls": calls,
        "invalid_tool_calls": [],
        "additional_kwargs": {},
        "response_metadata": metadata,
        "usage_metadata": (
            {
                "input_tokens": int(usage.get("prompt_tokens") or 0),
                "output_tokens": int(usage.get("completion_tokens") or 0),
                "total_tokens": int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0),
            }
            if isinstance(usage, dict)
            else None
        ),
    }


def tool_message(event: LoggedEvent) -> dict[str, Any]:
    data = event.data
    return {
        "type": "tool",
        "content": data.get("content", ""),
        "id": f"tool-{event.seq}",
        "name": data.get("name"),
        "tool_call_id": data.get("call_id"),
        "status": "error" if data.get("is_error") else "success",
        "additional_kwargs": {},
        "response_metadata": {},
    }


def delta_chunk(turn_seq: int | None, step: int, text: str) -> dict[str, Any]:
    """A streamed token delta as an AIMessageChunk (live only, never replayed)."""
    return {
        "type": "AIMessageChunk",
        "content": text,
        "id": ai_message_id(turn_seq, step),
        "tool_calls": [],
        "tool_call_chunks": [],
        "invalid_tool_calls": [],
        "additional_kwargs": {},
        "response_metadata": {},
    }


def completing_chunk(message: dict[str, Any], streamed: str) -> dict[str, Any]:
    """A committed AI message whose text was streamed as deltas, as the chunk
    that completes them: the text not streamed yet, and its tool calls.
    Clients concatenate chunks of one id, so the whole message again would
    show its text twice (a committed text that differs from what streamed,
    cut to fit, adds nothing: the `values` that follow carry it)."""
    content = str(message.get("content") or "")
    rest = content[len(streamed) :] if content.startswith(streamed) else ""
    calls = message.get("tool_calls") or []
    return {
        **message,
        "type": "AIMessageChunk",
        "content": rest,
        "tool_calls": calls,
        "tool_call_chunks": [
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i, "type": "tool_call_chunk"}
            for i, c in enumerate(calls)
        ],
    }


@dataclass(frozen=True)
class Request:
    seq: int
    call_id: str
    name: str
    args: dict[str, Any]


@dataclass
class Segment:
    """One run: where it opened, how it stands, and where it ended."""

    open_seq: int
    turn_seq: int
    status: str = "running"  # LangGraph run status
    end_seq: int | None = None
    error: str | None = None
    interrupt: list[Request] | None = None
    updated_seq: int = 0

    @property
    def ended(self) -> bool:
        return self.end_seq is not None


@dataclass
class Change:
    """What one event means to a LangGraph client (for the stream)."""

    message: dict[str, Any] | None = None
    node: str = ""
    interrupt: list[Request] | None = None
    error: str | None = None
    ended: Segment | None = None
    opened: Segment | None = None


@dataclass
class Tracker:
    """Folds a session's events, in seq order, into messages and runs."""

    session_id: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    turn_seq: int | None = None
    step: int = 0
    step_calls: dict[str, str] = field(default_factory=dict)  # call id -> name, of the step's message
    resulted: set[str] = field(default_factory=set)
    waiting: dict[str, Request] = field(default_factory=dict)  # unsettled approval requests
    cancelling: bool = False
    # The latest settlement of a request was its expiry (approval/expired, deny):
    # a resume that comes after it is a late verdict (approval_expired).
    expired: bool = False

    @property
    def current(self) -> Segment | None:
        seg = self.segments[-1] if self.segments else None
        return seg if seg is not None and not seg.ended else None

    @property
    def parked(self) -> Segment | None:
        """The last segment, if it ended at a park that still waits."""
        seg = self.segments[-1] if self.segments else None
        if seg is not None and seg.status == "interrupted" and seg.interrupt and self.waiting:
            return seg
        return None

    def pending_interrupt(self) -> dict[str, Any] | None:
        """The interrupt the thread waits on: the parked run's, with the calls
        still undecided (its id stays the one the run ended with)."""
        seg = self.parked
        if seg is None or not seg.interrupt:
            return None
        waiting = sorted(self.waiting.values(), key=lambda r: r.seq)
        return {
            "value": interrupt_value(waiting),
            "id": interrupt_id(self.session_id, seg.interrupt[0].seq),
        }

    def feed(self, event: LoggedEvent) -> Change:
        handler = getattr(self, "_on_" + event.kind.replace("/", "_"), None)
        change = handler(event) if handler is not None else Change()
        seg = self.current
        if seg is not None:
            seg.updated_seq = event.seq
        return change

    # -- turns and steps
    def _on_turn_start(self, e: LoggedEvent) -> Change:
        self.turn_seq, self.step, self.cancelling = e.seq, 0, False
        self.step_calls, self.resulted, self.waiting = {}, set(), {}
        seg = Segment(open_seq=e.seq, turn_seq=e.seq, updated_seq=e.seq)
        self.segments.append(seg)
        return Change(opened=seg)

    def _on_turn_end(self, e: LoggedEvent) -> Change:
        status = str(e.data.get("status", "completed"))
        seg = self.current  # a parked run has ended already: a cancel leaves it interrupted
        self.turn_seq, self.waiting = None, {}
        if seg is None:
            return Change()
        seg.status = RUN_STATUS.get(status, "error")
        seg.end_seq = e.seq
        seg.updated_seq = e.seq
        seg.error = e.data.get("error") or (None if seg.status != "error" else f"turn {status}")
        if status == "cancelled":
            seg.error = None
        return Change(ended=seg, error=seg.error if seg.status == "error" else None)

    def _on_turn_blocked(self, e: LoggedEvent) -> Change:
        seg = self.current
        if seg is not None:
            seg.status, seg.error = "error", str(e.data.get("reason", "blocked"))
        return Change(error=seg.error if seg else None)

    def _on_turn_retry_requested(self, e: LoggedEvent) -> Change:
        seg = self.current
        if seg is not None and seg.status == "error":
            seg.status, seg.error = "running", None
        return Change()

    def _on_turn_cancel_requested(self, e: LoggedEvent) -> Change:
        self.cancelling = True
        return Change()

    def _on_step_start(self, e: LoggedEvent) -> Change:
        self.step = int(e.data.get("step", self.step + 1))
        self.step_calls, self.resulted = {}, set()
        return Change()

    # -- messages
    def _add(self, message: dict[str, Any], node: str) -> Change:
        self.messages.append(message)
        return Change(message=message, node=node)

    def _on_user_message(self, e: LoggedEvent) -> Change:
        seg = self.current
        source = e.data.get("source_seq")
        if isinstance(source, int) and seg is not None and seg.open_seq == seg.turn_seq == self.turn_seq:
            # A turn opened from queued input (a follow-up, an interrupting or a
            # held input): its run is named by that input, known when it was queued.
            seg.open_seq = source
        return self._add(human_message(e.seq, str(e.data.get("text", ""))), "__start__")

    def _on_context_injected(self, e: LoggedEvent) -> Change:
        return self._add(human_message(e.seq, str(e.data.get("text", ""))), "__start__")

    def _on_assistant_message(self, e: LoggedEvent) -> Change:
        self.step_calls = {c["id"]: c["name"] for c in e.data.get("tool_calls") or []}
        self.resulted = set()
        return self._add(ai_message(e, self.turn_seq, self.step), "agent")

    def _on_tool_result(self, e: LoggedEvent) -> Change:
        self.resulted.add(str(e.data.get("call_id")))
        change = self._add(tool_message(e), "tools")
        parked = self._park_if_complete(e.seq)
        if parked is not None:
            change.interrupt, change.ended = parked.interrupt, parked
        return change

    # -- approvals
    def _on_approval_requested(self, e: LoggedEvent) -> Change:
        d = e.data
        self.expired = False
        self.waiting[str(d["call_id"])] = Request(e.seq, str(d["call_id"]), str(d["name"]), dict(d.get("args") or {}))
        parked = self._park_if_complete(e.seq)
        if parked is None:
            return Change()
        return Change(interrupt=parked.interrupt, ended=parked)

    def _on_approval_expired(self, e: LoggedEvent) -> Change:
        """An expiry that denies settles the request as a verdict would (one
        that parks leaves it waiting: the interrupt stays)."""
        if e.data.get("on_expiry") != "deny" or str(e.data.get("call_id")) not in self.waiting:
            return Change()
        change = self._on_approval_resolved(e)
        self.expired = True
        return change

    def _on_approval_resolved(self, e: LoggedEvent) -> Change:
        call_id = str(e.data.get("call_id"))
        request = self.waiting.get(call_id)
        if request is None or e.data.get("request_seq", request.seq) != request.seq:
            return Change()
        del self.waiting[call_id]
        self.expired = False
        if isinstance(e.data.get("edited_args"), dict):
            self._edit_call(call_id, e.data["edited_args"])
        last = self.segments[-1] if self.segments else None
        if self.waiting or last is None or last.status != "interrupted" or last.turn_seq != self.turn_seq:
            return Change()
        if self.cancelling:
            return Change()  # the cancel's own denials: the turn is closing, no new run
        seg = Segment(open_seq=e.seq, turn_seq=last.turn_seq, updated_seq=e.seq)
        self.segments.append(seg)
        return Change(opened=seg)

    def _edit_call(self, call_id: str, args: dict[str, Any]) -> None:
        """An approval with edits: the message's tool call shows the arguments
        that run, as HumanInTheLoopMiddleware rewrites the AI message."""
        for message in reversed(self.messages):
            for call in message.get("tool_calls") or []:
                if call["id"] == call_id:
                    call["args"] = dict(args)
                    return

    def _park_if_complete(self, seq: int) -> Segment | None:
        """The current segment ends at a park once every call of the step has
        a result or waits for a verdict, and at least one waits."""
        seg = self.current
        if seg is None or not self.waiting or self.cancelling:
            return None
        if any(cid not in self.resulted and cid not in self.waiting for cid in self.step_calls):
            return None
        seg.status, seg.end_seq, seg.updated_seq = "interrupted", seq, seq
        seg.interrupt = sorted(self.waiting.values(), key=lambda r: r.seq)
        return seg


def interrupt_value(requests: list[Request]) -> dict[str, Any]:
    """HumanInTheLoopMiddleware's HITLRequest for the calls parked in one step
    (langchain >= 1.0's ActionRequest: name, args, description).
    Every decision is allowed: reject is a deny, edit an approval with edited
    arguments (approvals_app.services.decide(edited_args=...))."""
    allowed = ["approve", "edit", "reject"]
    return {
        "action_requests": [
            {
                "name": r.name,
                "args": r.args,
                # langchain < 1.0's name for the same arguments, kept as an alias.
                "arguments": r.args,
                "description": f"Tool execution requires approval\n\nTool: {r.name}",
            }
            for r in requests
        ],
        "review_configs": [{"action_name": r.name, "allowed_decisions": list(allowed)} for r in requests],
    }


def interrupt_of(session_id: str, requests: list[Request]) -> dict[str, Any]:
    return {"value": interrupt_value(requests), "id": interrupt_id(session_id, requests[0].seq)}
