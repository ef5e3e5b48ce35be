"""The step logic of one open turn.

A TurnRunner reads its turn once (view.TurnView), then runs or resumes it
step by step: the model call here, then the reply's tool calls through
calls.ToolCalls (the veto, the gate, the executor, the effect ledger). What
it appends goes through its outbox (outbox.Outbox), fenced on the lease.

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
  blindly: effects.next_move decides, calls.py carries it out.
- A request that would not fit the model's context window (declared, or
  learned from a provider's context-length error: windows.py) is compacted
  first, inside the turn, at the step boundary before the model call; a
  context-length error teaches the window (the stated limit, or the refused
  request halved) and compacts, and the step tries once more; what still
  does not fit blocks the turn `context_overflow` for an operator, with the
  reason, rather than failing it (and every later turn with it). Never a loop.
- What the turn needs and the running code or its definition no longer
  provides (a built-in tool the definition names, the tool or MCP server of
  a call it owes, the main role's model, the summarizer or compactor role a
  refused request needs) blocks the turn `definition_missing`, naming it in
  `what` (definitions.py): the turn stays live, its ledger intact, until the
  definition is restored and the turn retried, or an operator abandons it.
- A cancel stops a streaming model call within about a second (stop.py);
  the text streamed so far is kept as a partial assistant message.
- While the process drains (a deploy's SIGTERM), the turn hands its session
  over at its next step boundary (lifecycle.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from django.conf import settings
from django.db import connection

from sessions_app.errors import DefinitionMissing, LeaseLost
from sessions_app.llm.abort import Abort
from sessions_app.llm.registry import get_adapter
from sessions_app.llm.types import (
    ContextTooLong,
    ModelCancelled,
    ModelError,
    ModelNotConfigured,
    ModelReply,
    for_model,
)
from sessions_app.log import hints
from sessions_app.log.partial import Recorder as StreamedText
from sessions_app.models import AgentProfile
from sessions_app.runtime import (
    admission,
    counters,
    definitions,
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
from sessions_app.runtime.calls import ToolCalls
from sessions_app.runtime.closing import closing_entries
from sessions_app.runtime.outbox import Outbox
from sessions_app.runtime.outcomes import Outcome
from sessions_app.runtime.owned import store as owned
from sessions_app.runtime.profiles import accepts_images
from sessions_app.runtime.stop import stop_watch
from sessions_app.runtime.view import TurnState, TurnView
from sessions_app.tools.registry import Registry

logger = logging.getLogger(__name__)

MAX_STEPS = 25


class TurnRunner:
    """Runs one open turn of `session_id` under `lease`."""

    def __init__(self, session_id: uuid.UUID, profile: AgentProfile, lease: leases.Lease) -> None:
        self.sid = session_id
        self.profile = profile
        self.lease = lease
        self.view = TurnView(session_id, profile, lease)
        self.outbox = Outbox(session_id, lease, self.view)
        self.calls = ToolCalls(session_id, profile, lease, self.view, self.outbox)
        self.resuming = False
        self.turn_seq = 0
        # Whether this step compacted already: a refusal after it blocks the turn (context_overflow).
        self.compacted_in_step = False
        # Why the last in-turn compaction could not run: a summarizer or role gone (definitions.py).
        self.compactor_missing: definitions.Missing | None = None
        self.last_call_ms = 0  # the wall time of the latest model call (step/end's latency_ms)
        # A stalled resume's wait before the sweep may drive it again (seconds).
        self.retry_after: float | None = None
        # Steers that wait behind a bounded take (the opening's, a drain's):
        # they ride the next step, each step taking at most the intake bound.
        # A claimed turn's workload tells whether any may wait; a turn this
        # drive opens is told by its opening (drive.py).
        work = lease.workload
        self.steers_left = work.open_turn_seq is not None and work.last_input_seq > work.inbox_seq
        self.intake_step = 0  # the step whose steers were taken in at the step boundary already

    @property
    def registry(self) -> Registry:
        return self.calls.registry  # built inside run(), so a profile that breaks the build fails its turn

    # -- plumbing

    def flush(self, *, release: bool = False) -> list[Any]:
        return self.calls.flush(release=release)  # it redoes inline calls if the policy moved

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
        """The first budget the next model call would pass (runtime/limits.py).
        The profile's daily limits are its live row's (as claimed), as every
        admission checks them, not the turn's version's: a day's spend is one
        pool for every version's sessions, and a limit raised while input was
        held lets that input's turn run, not refuse it at its first step."""
        budgeted = self.lease.driving.budgeted or self.view.budgeted
        pending = limits.buffered(self.outbox.buffer)  # the last step's tail rides the next commit
        live = self.lease.driving.profile or self.profile
        return limits.check(
            self.sid, live, opening=False, budgeted=budgeted, pending=pending, parent=self.lease.driving.parent
        )

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
            # Not before the first step: the opening's take is that step's intake.
            if st.inbox_pending or (self.steers_left and st.max_step > 0):
                self.flush()
                self.drain_inbox()
                self.intake_step = step
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
        outcome = self.calls.execute(message, st)
        if outcome is Outcome.BLOCKED and self.calls.missing is not None:
            return self.block_missing(self.calls.missing)
        if outcome is Outcome.PARKED:
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
        self.steers_left = admission.drain_inbox(self.sid, self.lease.fence)
        self.view.refresh()

    def step(self, step: int, resuming: bool) -> Outcome | None:
        spec = self.view.spec
        if self.held() is not None:
            return self.park_suspended()
        if step > 1 or resuming:  # the first step's check is the turn's own, above
            over = self.over_budget()
            if over is not None:
                return self.fail(failures.Failure(False, over.message), reason=over.as_json())
        absent = definitions.missing_builtin(self.registry)
        if absent is not None:  # before step/start: the step is not begun, nothing to resume
            return self.block_missing(absent)
        self.outbox.emit("step/start", {"step": step, "model": spec})
        self.flush()  # with the previous step's tail: one commit before the model call
        st = self.outbox.state()
        if st.cancel_requested:
            return self.close_cancelled(st)
        if st.inbox_pending and self.intake_step != step:  # one bounded intake a step
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
        except ModelNotConfigured as unserved:
            # The main role's model, as this code and deployment resolve it, has no provider:
            # nothing was sent, nothing spent (the step counts as refused: view.py).
            return self.block_missing(definitions.Missing("role:main", f"no model serves the main role: {unserved}"))
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
        if self.calls.answer(reply.tool_calls, st) is Outcome.PARKED:
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
        if declined is not None and self.compactor_missing is not None:
            missing = self.compactor_missing
            return self.block_missing(definitions.Missing(missing.what, f"{reason}, and {missing.reason}"))
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
        self.compactor_missing = None
        try:
            declined = hooks.compact_in_turn(self.sid, self.lease.fence, self.turn_seq)
        except DefinitionMissing as gone:
            self.compactor_missing = definitions.Missing(gone.what, str(gone))
            declined = str(gone)
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
        return self.block(failures.CONTEXT_OVERFLOW, reason)

    def block_missing(self, missing: definitions.Missing) -> Outcome:
        """Block the turn `definition_missing` on `missing`: what it needs is
        gone from the running code or its definition. Nothing is dropped: an
        owed call keeps waiting, an attempt of unknown outcome stays in the
        ledger; restoring the definition and a Retry, or an Abandon, moves it on."""
        logger.warning("turn of %s blocked: %s is missing: %s", self.sid, missing.what, missing.reason)
        return self.block(failures.DEFINITION_MISSING, missing.reason, what=missing.what)

    def block(self, code: str, reason: str, *, what: str = "") -> Outcome:
        attempts = self.outbox.state().attempts + 1
        data: dict[str, Any] = {"reason": failures.clean(reason), "attempts": attempts, "code": code}
        if what:
            data["what"] = what[:200]
        self.outbox.emit("turn/blocked", data)
        self.flush(release=True)
        return Outcome.BLOCKED

    def call_model(self, spec: str, messages: list[dict[str, Any]], step: int) -> ModelReply:
        tools = self.registry.specs()
        connection.close()  # no pooled connection is held across the model call
        started = time.monotonic()
        # The step's text so far, for a socket that connects mid-stream (log/partial.py).
        kept = StreamedText(self.sid, step)
        self.lease.model_call()

        def on_delta(text: str) -> None:
            self.lease.streamed_text()  # the progress mark; the lease keeper writes it (runtime/progress.py)
            kept.add(text)  # kept before it is published: a reader's copy never lacks a delta it saw
            hints.publish_delta(self.sid, {"step": step, "text": text})

        try:
            # The role's capability decides whether a tool's images reach the model as images.
            messages = for_model(messages, images=accepts_images(self.profile, "main"))
            watched = stop_watch.watching(self.sid, Abort(), self.lease.gen)
            with watched as abort, tracing.chat(self.sid, spec, step) as traced:
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

    # -- cancel

    def close_cancelled(self, st: TurnState) -> Outcome:
        """End cancelled. Calls still owed get an error result first. The
        turn's live foreground tasks settle before it closes (their abort
        intent committed first): it parks on them, and their receipts wake it."""
        live = owned.live_tasks(self.sid).filter(background=False, turn_seq=self.turn_seq)
        if live.exists():
            self.flush()
            owned.request_abort(list(live), "turn cancelled")
            return Outcome.PARKED
        for kind, data in closing_entries(st.events, "cancelled"):
            self.outbox.emit(kind, data)
        self.flush(release=True)
        return Outcome.ENDED


def too_long_after_compaction(spec: str, refused: ContextTooLong) -> str:
    return f"the request does not fit {spec}'s context window even after compaction: {refused}"


def _assistant_payload(reply: ModelReply) -> dict[str, Any]:
    data: dict[str, Any] = {
        "content": reply.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
    }
    if reply.usage is not None:
        data["usage"] = reply.usage.as_json()
    return storable.fit_assistant(data)
