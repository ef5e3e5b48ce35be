"""The step logic of one open turn.

A TurnRunner reads its turn once (view.TurnView), then runs or resumes it
step by step: the model call, then each tool call through the pre-execute
hooks (the allow-list's veto), the approval gate and the executor. What it
appends goes through its outbox (outbox.Outbox), fenced on the lease.

Rules kept here:
- Model calls and tool runs happen outside any transaction, with the
  database connection handed back to the pool first.
- A turn holds no worker while parked: the runner returns, and the commit of
  approval/resolved wakes a worker again.
- The projection never carries a tool call without its result: a cancelled
  or failed turn gives every owed call an error result before it ends
  (closing.py).
- Every turn ends, or is visibly blocked: whatever a step raises closes the
  turn `failed` with the error, except a transient failure of a turn
  re-entered after a crash, which is retried with backoff a bounded number
  of times and then blocked (failures.py decides which is which). Database
  outages and a lost lease are the drive's business, not the turn's.
- Every external effect has its intent committed first (tool/attempt), and
  an attempt a crash left without an outcome is re-run, reconciled with its
  target or put before an operator by the tool's replay policy, never re-run
  blindly (effects.py).
- A request that would not fit the model's context window (declared, or
  learned from a provider's context-length error: windows.py) is compacted
  first, inside the turn, at the step boundary before the model call; a
  context-length error teaches the window (the stated limit, or the refused
  request halved) and compacts, and the step tries once more; what still
  does not fit blocks the turn `context_overflow` for an operator, with the
  reason, rather than failing it (and every later turn with it). Never a loop.
- A cancel stops a streaming model call within about a second (stop.py);
  the text streamed so far is kept as a partial assistant message.
- While the process drains (a deploy's SIGTERM), the turn hands its session
  over at its next step boundary (lifecycle.py).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from sessions_app.errors import LeaseLost
from sessions_app.llm.abort import Abort
from sessions_app.llm.registry import get_adapter
from sessions_app.llm.types import ContextTooLong, ModelCancelled, ModelError, ModelReply, ToolCall, for_model
from sessions_app.log import hints
from sessions_app.log.partial import Recorder as StreamedText
from sessions_app.log.records import LoggedEvent
from sessions_app.models import AgentProfile
from sessions_app.runtime import (
    admission,
    counters,
    effects,
    failpoints,
    failures,
    hooks,
    lifecycle,
    limits,
    request,
    storable,
    tracing,
    windows,
)
from sessions_app.runtime import lease as leases
from sessions_app.runtime.closing import closing_entries
from sessions_app.runtime.outbox import Entry, InlineCall, Outbox
from sessions_app.runtime.outcomes import Outcome
from sessions_app.runtime.profiles import accepts_images
from sessions_app.runtime.stop import stop_watch
from sessions_app.runtime.view import TurnState, TurnView
from sessions_app.tools.base import Definition, Reconciliation, ToolContext
from sessions_app.tools.executor import execute
from sessions_app.tools.registry import Registry, on_progress, registry_for_profile

logger = logging.getLogger(__name__)

MAX_STEPS = 25

# A tool call's progress notifications are live hints on the session's stream, never log events.
on_progress(hints.publish_live)


class TurnRunner:
    """Runs one open turn of `session_id` under `lease`."""

    def __init__(self, session_id: uuid.UUID, profile: AgentProfile, lease: leases.Lease) -> None:
        self.sid = session_id
        self.profile = profile
        self.lease = lease
        self._registry: Registry | None = None
        self.view = TurnView(session_id, profile, lease)
        self.outbox = Outbox(session_id, lease, self.view)
        self.resuming = False
        # Set when a call's outcome is unknown: the turn waits for an operator,
        # and no further external attempt starts before one answers.
        self.awaiting_operator = False
        self.turn_seq = 0
        # Whether this step compacted already: a refusal after it blocks the turn (context_overflow).
        self.compacted_in_step = False
        self.last_call_ms = 0  # the wall time of the latest model call (step/end's latency_ms)
        # Calls a reviewer approved with edited arguments: call id -> the JSON that ran,
        # so their result can tell the model (set per call in run_call, read by result).
        self.edited: dict[str, str] = {}
        # A stalled resume's wait before the sweep may drive it again (seconds).
        self.retry_after: float | None = None

    @property
    def registry(self) -> Registry:
        # Built inside run(), so a profile that breaks the build fails its turn.
        if self._registry is None:
            self._registry = registry_for_profile(self.profile)
        return self._registry

    # -- plumbing

    def flush(self, *, release: bool = False) -> list[Any]:
        return self.outbox.flush(self.redo_inline, release=release)

    def facts(self) -> hooks.TurnFacts:
        released = self.outbox.released
        return hooks.TurnFacts(
            profile=self.profile,
            titled=self.lease.driving.titled,
            first_user_text=self.view.first_user_text,
            last_prompt_tokens=self.view.last_prompt_tokens,
            overrides=self.lease.driving.overrides,
            slots_wanted=released.slots_wanted if released is not None else None,
        )

    def end(self, status: str, error: str = "", reason: dict[str, Any] | None = None) -> Outcome:
        data: dict[str, Any] = {"status": status, "error": error} if error else {"status": status}
        if reason:
            data["reason"] = reason
        self.outbox.emit("turn/end", data)
        self.flush(release=True)
        return Outcome.ENDED

    def held(self) -> limits.Hold | None:
        """An operator's suspension holding this session (runtime/limits.py)."""
        return limits.hold_of(self.profile, suspended=self.view.suspended)

    def park_suspended(self) -> Outcome:
        """Stop at this step boundary and give the lease up; the turn stays
        open and runs on when the suspension is lifted (a resume wakes it)."""
        if self.outbox.buffer:
            self.flush(release=True)
        if self.outbox.released is None:
            leases.release(self.lease)
        return Outcome.SUSPENDED

    def over_budget(self) -> limits.Exceeded | None:
        """The first budget the next model call would pass (runtime/limits.py)."""
        budgeted = self.lease.driving.budgeted or self.view.budgeted
        pending = limits.buffered(self.outbox.buffer)  # the last step's tail rides the next commit
        return limits.check(self.sid, self.profile, opening=False, budgeted=budgeted, pending=pending)

    # -- the turn

    def run(self, turn_seq: int) -> Outcome:
        self.turn_seq = turn_seq
        self.view.load(turn_seq)
        with tracing.turn(self.sid, self.profile.name, turn_seq, self.view.events) as traced:
            return traced.outcome(self._run_or_fail())

    def _run_or_fail(self) -> Outcome:
        try:
            return self._run()
        except LeaseLost:
            raise
        except Exception as exc:
            if failures.is_database_outage(exc):
                raise  # the drive retries the drive; the turn did not fail
            logger.warning("turn of %s failed: %s", self.sid, exc, exc_info=not isinstance(exc, ModelError))
            return self.fail(failures.classify(exc))

    def _run(self) -> Outcome:
        st = self.outbox.state()
        self.resuming = resuming = st.reentry
        if resuming:
            counters.add("lease_takeovers")  # its worker stopped mid-step: this drive took it over
        if st.cancel_requested:
            return self.close_cancelled(st)
        if self.held() is not None:
            return self.park_suspended()
        if not resuming:
            reason = hooks.first_rejection(hooks.StepContext(self.sid, self.profile))
            if reason:
                return self.end("rejected", reason)
            over = self.over_budget()
            if over is not None:
                return self.end("rejected", over.message, over.as_json())
        if st.open_step is not None:
            outcome = self.close_open_step(st)
            if outcome is not None:
                return outcome
        while True:
            st = self.outbox.state()
            if st.cancel_requested:
                return self.close_cancelled(st)
            if self.lease.lost.is_set():
                return Outcome.LOST
            if lifecycle.draining.is_set():
                return self.hand_off()
            step = st.max_step + 1
            if step > MAX_STEPS:
                return self.end("failed", f"the turn exceeded {MAX_STEPS} steps")
            if st.inbox_pending:
                self.flush()
                self.drain_inbox()
                st = self.outbox.state()
            if st.max_step == 0 and not st.has_input:
                return self.end("empty")
            outcome = self.step(step, resuming)
            if outcome is not None:
                return outcome

    def close_open_step(self, st: TurnState) -> Outcome | None:
        """Resume inside a step: re-execute what its assistant message still
        owes (verdicts come from the log), then close it. A step that died
        before its assistant message stays unclosed; numbering continues."""
        message = st.assistant_in_open_step()
        if st.open_step is None:
            return None
        if message is None:
            if not st.step_spend_known(st.open_step):
                # Its request may have been made and charged; nobody will know the figure.
                model = next((e.data["model"] for e in st.events if e.seq == st.open_step_seq), self.view.spec)
                self.spent(model, st.open_step, None, "the worker stopped before the reply was recorded")
            return None
        if self.execute_calls(message, st) is Outcome.PARKED:
            return Outcome.PARKED
        end: dict[str, Any] = {"step": st.open_step}
        if message.data.get("usage"):
            end["usage"] = message.data["usage"]
        self.outbox.emit("step/end", end)
        return None

    def spent(self, spec: str, step: int, usage: dict[str, Any] | None, reason: str) -> None:
        """A model request's spend that no step/end will carry (usage None:
        unknown, counted as unpriced, never as $0)."""
        entry = {"purpose": "step", "model": spec, "usage": usage, "step": step, "reason": reason}
        self.outbox.emit("usage/recorded", entry)

    def drain_inbox(self) -> None:
        """Queued input rides into the next step as context/injected."""
        admission.drain_inbox(self.sid, self.lease.fence)
        self.view.refresh()

    def step(self, step: int, resuming: bool) -> Outcome | None:
        spec = self.view.spec
        if self.held() is not None:
            return self.park_suspended()
        if step > 1 or resuming:  # the first step's check is the turn's own, above
            over = self.over_budget()
            if over is not None:
                return self.fail(failures.Failure(False, over.message), reason=over.as_json())
        self.outbox.emit("step/start", {"step": step, "model": spec})
        self.flush()  # with the previous step's tail: one commit before the model call
        st = self.outbox.state()
        if st.cancel_requested:
            return self.close_cancelled(st)
        if st.inbox_pending:
            self.drain_inbox()
            st = self.outbox.state()
        self.compacted_in_step = False
        messages = self.fit_window(spec, self.request_messages())
        try:
            try:
                reply = self.call_model(spec, messages, step)
            except ContextTooLong as refused:
                compacted = self.after_context_error(spec, refused, messages)
                if isinstance(compacted, Outcome):
                    return compacted
                messages = compacted
                try:
                    reply = self.call_model(spec, messages, step)  # once: refused again, the turn is blocked
                except ContextTooLong as again:
                    self.learn_window(spec, again, messages)  # so the next attempt starts within it
                    return self.overflow(too_long_after_compaction(spec, again))
        except ModelCancelled as stopped:
            # Keep what streamed before the Stop, marked partial; no tool call.
            partial = _assistant_payload(ModelReply(stopped.partial.content, [], stopped.partial.usage))
            self.outbox.emit("assistant/message", {**partial, "partial": True})
            return self.close_cancelled(self.outbox.state())
        except ModelError as failed:
            if failed.usage is not None:  # spent before it failed: a torn stream, a deadline
                self.spent(spec, step, failed.usage.as_json(), f"the call failed: {type(failed).__name__}")
            raise
        self.outbox.emit("assistant/message", _assistant_payload(reply))
        end: dict[str, Any] = {"step": step, "model": spec, "latency_ms": self.last_call_ms}
        if reply.usage is not None:
            end["usage"] = reply.usage.as_json()
        if not reply.tool_calls:
            self.outbox.emit("step/end", end)
            return self.end("completed")
        if all(self.runs_inline(call) for call in reply.tool_calls):
            # Nothing but inline calls: no commit before them (see
            # Definition.runs_inline); the message keeps its provisional seq.
            message = self.outbox.provisional(1)
        else:
            (appended,) = self.flush()[-1:]
            message = LoggedEvent(appended.seq, appended.kind, appended.data)
        # `st` predates this message, which is right: its calls have no
        # results or verdicts yet, and earlier verdicts of the turn are in it.
        if self.execute_calls(message, st) is Outcome.PARKED:
            return Outcome.PARKED
        self.outbox.emit("step/end", end)
        return None

    # -- the context window

    def request_messages(self) -> list[dict[str, Any]]:
        return request.messages(self.profile, self.view.messages)

    def fit_window(self, spec: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The request as is when it fits the window (or none is known);
        otherwise compacted first. A request still over the estimate after
        compacting, or one compaction could not help, is sent anyway: the
        provider has the last word (a window believed too small, after a
        provider raised it, must not keep a turn from running)."""
        window = windows.window_for(self.profile, "main", spec)
        if window is None:
            return messages
        tokens = windows.estimate_tokens(messages, self.registry.specs())
        if windows.fits(tokens, window):
            return messages
        reason = f"the request (about {tokens} tokens) would not fit the {window}-token window of {spec}"
        declined = self.compact_now(reason)
        if declined is not None:
            logger.info("%s: %s, and compaction could not help (%s); sent as it is", self.sid, reason, declined)
            return messages
        return self.request_messages()

    def after_context_error(
        self, spec: str, refused: ContextTooLong, messages: list[dict[str, Any]]
    ) -> list[dict[str, Any]] | Outcome:
        """Learn the window from the refusal, compact, and let the step try
        once more. What cannot get under the window (the floor reached, a
        compaction already made in this step, one that declined) blocks the
        turn: never a loop, never a failure that every later turn repeats."""
        window = self.learn_window(spec, refused, messages)
        if window is None:
            floor = settings.TERRET_CONTEXT_FLOOR_TOKENS
            return self.overflow(
                f"{spec} refused the request as too long for its context window ({refused}), and no smaller "
                f"window is left to try above the floor of {floor} tokens"
            )
        if self.compacted_in_step:
            return self.overflow(too_long_after_compaction(spec, refused))
        reason = f"{spec} refused the request as too long for its context window ({refused})"
        declined = self.compact_now(reason)
        if declined is not None:
            return self.overflow(f"{reason}, and compaction could not help: {declined}")
        return self.request_messages()

    def learn_window(self, spec: str, refused: ContextTooLong, messages: list[dict[str, Any]]) -> int | None:
        """Record what `refused` teaches of `spec`'s window (windows.after_refusal):
        model/window when it changed, for every session of the model. The
        window now believed; None when nothing above the floor is left."""
        known = windows.window_for(self.profile, "main", spec)
        estimate = windows.estimate_tokens(messages, self.registry.specs())
        window = windows.after_refusal(known, estimate, refused.limit_tokens)
        if window is not None and window != known:
            source = "error" if window == refused.limit_tokens else "refusal"
            self.outbox.emit("model/window", {"role": "main", "spec": spec, "tokens": window, "source": source})
            self.flush()
            windows.remember(spec, window)
        return window

    def compact_now(self, reason: str) -> str | None:
        """Compact inside the turn, here at the step boundary (every call
        before it has its result; nothing is parked), and read the view
        again. None when it compacted, else why not."""
        self.flush()
        declined = hooks.compact_in_turn(self.sid, self.lease.fence, self.turn_seq)
        self.view.refresh()
        if declined is None:
            logger.info("compacted %s inside its turn: %s", self.sid, reason)
            self.compacted_in_step = True
        return declined

    def overflow(self, reason: str) -> Outcome:
        """Block the turn `context_overflow`: its request cannot be brought
        under the model's window here. Failing it would fail every later turn
        too; blocked, it waits for an operator (a Retry after a bigger window
        or a shorter prompt, an Abandon) or new input. The step stays open;
        its refused requests cost nothing (TurnState.refused_step)."""
        attempts = self.outbox.state().attempts + 1
        code = failures.CONTEXT_OVERFLOW
        self.outbox.emit("turn/blocked", {"reason": failures.clean(reason), "attempts": attempts, "code": code})
        self.flush(release=True)
        return Outcome.BLOCKED

    def call_model(self, spec: str, messages: list[dict[str, Any]], step: int) -> ModelReply:
        tools = self.registry.specs()
        connection.close()  # no pooled connection is held across the model call
        started = time.monotonic()
        # The step's text so far, for a socket that connects mid-stream (log/partial.py).
        kept = StreamedText(self.sid, step)

        def on_delta(text: str) -> None:
            kept.add(text)  # kept before it is published: a reader's copy never lacks a delta it saw
            hints.publish_delta(self.sid, {"step": step, "text": text})

        try:
            # The role's capability decides whether a tool's images reach the model as images.
            messages = for_model(messages, images=accepts_images(self.profile, "main"))
            with stop_watch.watching(self.sid, Abort()) as abort, tracing.chat(self.sid, spec, step) as traced:
                return traced.replied(get_adapter(spec).complete(spec, messages, tools, on_delta=on_delta, abort=abort))
        finally:
            kept.close()
            self.last_call_ms = int((time.monotonic() - started) * 1000)

    # -- failure, hand-over

    def fail(self, failure: failures.Failure, reason: dict[str, Any] | None = None) -> Outcome:
        """Close the turn failed, or (a transient failure of a re-entered
        turn) record a stalled attempt and leave the turn for a retry, or
        block it after TERRET_RESUME_ATTEMPTS attempts."""
        self.outbox.keep_storable()  # what failed may be in the buffer; keep the rest
        self.view.refresh()
        st = self.outbox.state()
        if not (failure.transient and self.resuming):
            owed = f"failed: {failure.message[:200]}"
            entries = closing_entries(st.events, "failed", error=failure.message, owed=owed, reason=reason)
            for kind, data in entries:
                self.outbox.emit(kind, data)
            self.flush(release=True)
            return Outcome.ENDED
        attempt = st.attempts + 1
        if attempt >= settings.TERRET_RESUME_ATTEMPTS:
            blocked = {"reason": failure.message, "attempts": attempt, "code": failures.RETRIES_EXHAUSTED}
            self.outbox.emit("turn/blocked", blocked)
            self.flush(release=True)
            return Outcome.BLOCKED
        self.retry_after = settings.TERRET_RESUME_BACKOFF_SECONDS * 2 ** (attempt - 1)
        self.outbox.emit("turn/stalled", {"attempt": attempt, "error": failure.message, "retry_in": self.retry_after})
        self.flush()
        return Outcome.RESUME_FAILED

    def hand_off(self) -> Outcome:
        """Commit what is buffered and give the lease up in the same statement
        (the process is draining); the drive wakes another worker."""
        self.flush(release=True)
        if self.outbox.released is None:
            leases.release(self.lease)
        return Outcome.HANDED_OFF

    # -- tools

    def runs_inline(self, call: ToolCall) -> bool:
        """A call the runner makes without committing first: an inline tool
        (Definition.runs_inline) that no approval setting makes ask."""
        defn = self.registry.get(call.name)
        return (
            defn is not None
            and defn.runs_inline
            and not hooks.gate().needs_approval(defn, self.profile.approvals or {})
        )

    def execute_calls(self, message: LoggedEvent, st: TurnState) -> Outcome | None:
        parked = False
        for call in st.owed_calls(message):
            if self.run_call(call, st, message.seq) is Outcome.PARKED:
                parked = True
            if self.awaiting_operator:
                break
        if parked:
            self.flush()
            return Outcome.PARKED
        return None

    def run_call(self, call: ToolCall, st: TurnState, message_seq: int = 0) -> Outcome | None:
        self.edited.pop(call.id, None)
        defn = self.registry.get(call.name)
        if defn is None:
            return self.result(call, f"unknown tool {call.name!r}", True)
        if self.view.revoked:
            return self.result(call, "denied: the session is revoked", True)
        if storable.was_cut(call.arguments):
            limit = settings.TERRET_MAX_TOOL_ARGS_CHARS
            return self.result(call, f"not run: the arguments were longer than {limit} characters and were cut", True)
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            return self.result(call, "arguments are not valid JSON", True)
        if not isinstance(args, dict):
            return self.result(call, "arguments must be a JSON object", True)
        if self.runs_inline(call):
            self.outbox.emit_inline(call, defn, args, self.inline_result(call, defn, args))
            return None
        # Commit what is buffered first: that commit reveals any policy/updated
        # committed meanwhile (outbox.py), so the veto sees every update.
        self.flush()
        veto = hooks.first_veto(self.call_context(defn, args))
        if veto:
            return self.result(call, f"vetoed: {veto}", True)
        gate = hooks.gate()
        # Verdicts bind to this call: same id, tool and args, asked after its message.
        decision = gate.check(
            st.events,
            defn,
            self.profile.approvals or {},
            call.id,
            args,
            after_seq=message_seq,
            ctx=self.call_context(defn, args),
        )
        if decision.action == "ask":
            self.flush()  # the request's row-lock check must see everything before it
            if not gate.request(self.sid, self.lease.fence, call.id, call.name, args):
                # Cancelled meanwhile: asking now would leave a request no one denies.
                return self.result(call, "cancelled: the turn was cancelled", True)
            self.view.refresh()
            return Outcome.PARKED
        if decision.action == "park":
            return Outcome.PARKED
        if decision.action == "deny":
            return self.result(call, f"denied: {decision.reason}", True)
        if decision.args is not None:
            # Approved with edits: the reviewer's arguments run (and are what a
            # retry, a reconcile and the ledger see), not the model's.
            call = ToolCall(call.id, call.name, json.dumps(decision.args, ensure_ascii=False))
            self.edited[call.id] = call.arguments
        return self.run_tool(defn, call, st, message_seq)

    def call_context(self, defn: Definition, args: dict[str, Any]) -> hooks.CallContext:
        return hooks.CallContext(self.sid, self.profile, defn, args, policy_known=True, policy_seq=self.view.policy_seq)

    def inline_result(self, call: ToolCall, defn: Definition, args: dict[str, Any]) -> Entry:
        """The tool/result of an inline call under the view's policy (an
        inline call never asks for approval: see runs_inline)."""
        veto = hooks.first_veto(self.call_context(defn, args))
        if veto:
            return _result(call, f"vetoed: {veto}", True)
        with tracing.tool(self.sid, call.name, call.id) as traced:
            outcome = execute(defn, self.tool_context(call, 0), call.arguments)
            traced.result(outcome.is_error)
        return _result(call, outcome.content, outcome.is_error)

    def redo_inline(self, pending: InlineCall) -> Entry:
        return self.inline_result(pending.call, pending.definition, pending.args)

    def tool_context(self, call: ToolCall, message_seq: int, attempt: int = 0) -> ToolContext:
        return ToolContext(
            self.sid,
            call.id,
            settings.TERRET_WORKSPACE_ROOT / self.sid.hex,
            idempotency_key=effects.idempotency_key(self.sid, message_seq, call.id),
            attempt=attempt,
            fence=self.lease.gen,
        )

    def run_tool(self, defn: Definition, call: ToolCall, st: TurnState, message_seq: int) -> Outcome | None:
        """Run the call as a new attempt, unless an earlier attempt of it has
        no outcome: then its replay policy decides (effects.py)."""
        ledger = effects.ledgers(st.events, after=message_seq).get(call.id)
        last = ledger.last if ledger else None
        if last is None:
            self.attempt(defn, call, st, message_seq, 1)
            return None
        settled = self.settle(defn, call, last, message_seq)
        if isinstance(settled, _Rerun):
            self.attempt(defn, call, st, message_seq, last.number + 1, replaces=(last.number, settled.why))
            return None
        return settled

    def attempt(
        self,
        defn: Definition,
        call: ToolCall,
        st: TurnState,
        message_seq: int,
        number: int,
        replaces: tuple[int, str] | None = None,
    ) -> None:
        ctx = self.tool_context(call, message_seq, number)
        intent: dict[str, Any] = {
            "call_id": call.id,
            "name": call.name,
            "attempt": number,
            "idempotency_key": ctx.idempotency_key,
            "replay": defn.replay_policy,
            "fence": self.lease.gen,
            "worker": self.lease.owner,
        }
        if st.open_step is not None:
            intent["step"] = st.open_step
        if replaces is not None:
            intent["replaces"], intent["why"] = replaces
        if call.id in self.edited:
            intent["arguments"], intent["edited"] = call.arguments, True  # what actually runs
        self.outbox.emit("tool/attempt", intent)
        self.flush()  # the intent, and earlier results, are durable before the effect
        connection.close()  # tools may be slow; hold no connection meanwhile
        failpoints.pause("after_intent", defn.name)
        with tracing.tool(self.sid, call.name, call.id) as traced:
            outcome = execute(defn, ctx, call.arguments)
            traced.result(outcome.is_error)
        failpoints.pause("after_effect", defn.name)
        self.result(call, outcome.content, outcome.is_error, attempt=number)

    def settle(self, defn: Definition, call: ToolCall, last: effects.Attempt, message_seq: int) -> Any:
        """An attempt of this call already exists: a _Rerun to run the next
        one, None once its outcome is buffered, PARKED while an operator decides."""
        match last.state:
            case "unknown":
                return self._await_operator()
            case "resolved":
                resolution = last.resolution or {}
                if resolution.get("action") == "rerun":
                    return _Rerun("rerun")
                failed = resolution.get("action") == "failed"
                content = str(resolution.get("result") or "")
                if failed:
                    content = f"failed: marked failed by an operator ({resolution.get('by', '')})" + (
                        f": {content}" if content else ""
                    )
                content = content or "done (marked done by an operator)"
                return self.result(call, content, failed, last.number, "operator")
            case "done" | "failed":
                return None
        # In flight when its worker stopped: the effect may have happened.
        policy = effects.stricter(str(last.data.get("replay", "")), defn)
        if policy == "safe":
            return _Rerun("safe")
        if policy == "reconcile" and defn.reconcile is not None:
            answer = self.reconcile(defn, call, last, message_seq)
            if answer.state == "not_done":
                return _Rerun("not_done")
            if answer.state == "done":
                return self.result(call, answer.result, False, last.number, "reconcile")
            reason = answer.result or "its target could not tell whether it happened"
        else:
            reason = "the worker stopped before its outcome was recorded, and the tool may not be re-run blindly"
        unknown = {"call_id": call.id, "name": call.name, "attempt": last.number, "reason": reason}
        self.outbox.emit("tool/unknown", unknown)
        return self._await_operator()

    def reconcile(self, defn: Definition, call: ToolCall, last: effects.Attempt, message_seq: int) -> Reconciliation:
        assert defn.reconcile is not None
        try:
            args = json.loads(call.arguments or "{}")
            connection.close()  # the target may be slow to answer
            return defn.reconcile(self.tool_context(call, message_seq, last.number), args)
        except Exception as exc:
            logger.warning("reconcile of %s in %s failed: %s", call.id, self.sid, exc, exc_info=True)
            return Reconciliation("unknown", f"its reconcile hook failed ({type(exc).__name__})")

    def _await_operator(self) -> Outcome:
        self.awaiting_operator = True
        return Outcome.PARKED

    def result(self, call: ToolCall, content: str, is_error: bool, attempt: int = 0, via: str = "") -> Outcome | None:
        """Buffer the call's result; the call needs nothing more (None)."""
        if call.id in self.edited:
            ran = self.edited.pop(call.id)
            content = f"(A reviewer edited the arguments before approving; the tool ran with {ran})\n{content}"
        kind, data = _result(call, content, is_error)
        if attempt:
            data["attempt"] = attempt
        if via:
            data["via"] = via
        self.outbox.emit(kind, data)
        return None

    # -- cancel

    def close_cancelled(self, st: TurnState) -> Outcome:
        """End cancelled. Calls still owed get an error result first."""
        for kind, data in closing_entries(st.events, "cancelled"):
            self.outbox.emit(kind, data)
        self.flush(release=True)
        return Outcome.ENDED


def too_long_after_compaction(spec: str, refused: ContextTooLong) -> str:
    return f"the request does not fit {spec}'s context window even after compaction: {refused}"


@dataclass(frozen=True)
class _Rerun:
    """settle(): run a new attempt, which replaces the last one, for this reason."""

    why: str  # safe | not_done | rerun (tool/attempt's `why`)


def _result(call: ToolCall, content: str, is_error: bool) -> Entry:
    # A ToolText (llm/types.py) is stored as plain text, its images beside it.
    text = storable.fit_result(str(content))
    data: dict[str, Any] = {"call_id": call.id, "name": call.name, "content": text, "is_error": is_error}
    images = getattr(content, "attachments", None)
    if images:
        data["content"], kept = storable.fit_attachments(text, images)  # each kept whole or left out
        if kept:
            data["attachments"] = kept
    return "tool/result", data


def _assistant_payload(reply: ModelReply) -> dict[str, Any]:
    data: dict[str, Any] = {
        "content": reply.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
    }
    if reply.usage is not None:
        data["usage"] = reply.usage.as_json()
    return storable.fit_assistant(data)
