"""The tool-call half of a turn: an assistant message's calls, each through
the pre-execute hooks (the allow-list's veto), the approval gate and the
executor, with every external effect recorded in the effect ledger.

A call that is not inline is carried out the way DBOS's invoke_step runs a
step: the ledger is read first (effects.next_move, a pure decision over the
call's attempts and the tool's replay policy), and only a `Run` reaches the
tool, in `attempt`, the one place that commits the intent (tool/attempt)
before the effect and buffers the outcome (tool/result) after it. A crash
between the two leaves an attempt without outcome, and the next worker's
next_move decides what to do about it (effects.py).

Rules kept here:
- An inline call (Definition.runs_inline, and no approval setting makes it
  ask) commits nothing before it runs; its result rides the next commit,
  guarded on the policy it was judged under (outbox.py).
- Any other call commits what is buffered first, so the veto and the gate
  see every policy/updated and verdict committed before it.
- While one call of a message waits for an operator, no further external
  attempt of the message starts; a call waiting for a reviewer's verdict
  does not hold the others back.
- A call owed from an earlier drive whose tool is gone (definitions.py)
  blocks the turn: the model never hears "unknown tool" about a call made
  while the tool existed. Only a call of the reply just received, to a name
  its tool list lacks, gets that error result.
- The tool runs outside any transaction, with the database connection
  handed back to the pool first.
"""

from __future__ import annotations

import json
import logging
import uuid
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import connection

from sessions_app.llm.types import ToolCall
from sessions_app.log import hints
from sessions_app.log.records import AppendedEvent, LoggedEvent
from sessions_app.models import AgentProfile
from sessions_app.runtime import definitions, effects, failpoints, hooks, storable, tracing
from sessions_app.runtime import lease as leases
from sessions_app.runtime.outbox import Entry, InlineCall, Outbox
from sessions_app.runtime.outcomes import Outcome
from sessions_app.runtime.owned import waits
from sessions_app.runtime.view import TurnState, TurnView
from sessions_app.tools.base import Definition, Reconciliation, ToolContext
from sessions_app.tools.executor import execute
from sessions_app.tools.registry import Registry, on_progress, registry_for_profile, unlisted_now

logger = logging.getLogger(__name__)

# A tool call's progress notifications are live hints on the session's stream, never log events.
on_progress(hints.publish_live)


class Waits(StrEnum):
    """What a call that could not finish now waits for."""

    VERDICT = "verdict"  # a reviewer's: the message's other calls go on
    OPERATOR = "operator"  # an operator's, on an effect of unknown outcome: no other attempt starts
    DEFINITION = "definition"  # its tool is gone: the turn is blocked (ToolCalls.missing says on what)
    TASKS = "tasks"  # owned tasks' terminal receipts (runtime/owned/waits.py): the message's other calls go on


class ToolCalls:
    """The calls of one open turn of `session_id` under `lease`, appending
    through the turn's outbox."""

    def __init__(
        self, session_id: uuid.UUID, profile: AgentProfile, lease: leases.Lease, view: TurnView, outbox: Outbox
    ) -> None:
        self.sid = session_id
        self.profile = profile
        self.lease = lease
        self.view = view
        self.outbox = outbox
        self._registry: Registry | None = None
        # What the last execute stopped on when it returned BLOCKED.
        self.missing: definitions.Missing | None = None
        # MCP tools an owed call was checked against its server for, this drive: why each is gone (None: listed).
        self._asked: dict[str, str | None] = {}

    @property
    def registry(self) -> Registry:
        # Built on first use inside the turn, so a profile that breaks the build fails its turn.
        if self._registry is None:
            self._registry = registry_for_profile(self.profile)
        return self._registry

    def flush(self, *, release: bool = False) -> list[AppendedEvent]:
        """Commit the outbox; an inline call is decided again if the policy
        moved meanwhile (outbox.py)."""
        return self.outbox.flush(self.redo_inline, release=release)

    def runs_inline(self, call: ToolCall) -> bool:
        """A call made without committing first: an inline tool
        (Definition.runs_inline) that no approval setting makes ask."""
        defn = self.registry.get(call.name)
        return (
            defn is not None
            and defn.runs_inline
            and not hooks.gate().needs_approval(defn, self.profile.approvals or {})
        )

    # -- a message's calls

    def answer(self, calls: list[ToolCall], st: TurnState) -> Outcome | None:
        """Run the calls of the assistant message just buffered. `st`
        predates the message, which is right: its calls have no results or
        verdicts yet, and the turn's earlier verdicts are in it."""
        if all(self.runs_inline(call) for call in calls):
            # Nothing but inline calls: no commit before them (see
            # Definition.runs_inline); the message keeps its provisional seq.
            message = self.outbox.provisional(1)
        else:
            (appended,) = self.flush()[-1:]
            message = LoggedEvent(appended.seq, appended.kind, appended.data)
        return self.execute(message, st, owed=False)

    def execute(self, message: LoggedEvent, st: TurnState, *, owed: bool = True) -> Outcome | None:
        """Run what `message` still owes (verdicts and attempts come from the
        log in `st`); PARKED when a call waits for someone, BLOCKED when an
        owed call's tool is gone (`missing` says what). `owed`: the message
        is from an earlier drive, so its calls were made under the definition
        of then; False for the reply just received."""
        waiting: Waits | None = None
        for call in st.owed_calls(message):
            waits = self.run_call(call, st, message.seq, owed=owed)
            waiting = waits or waiting
            if waits in (Waits.OPERATOR, Waits.DEFINITION):  # the last call looked at: it decides
                break
        if waiting is not None:
            self.flush()
            return Outcome.BLOCKED if waiting is Waits.DEFINITION else Outcome.PARKED
        return None

    def run_call(self, call: ToolCall, st: TurnState, message_seq: int, *, owed: bool = True) -> Waits | None:
        defn = self.registry.get(call.name)
        if (defn is None and owed) or (owed and self.unlisted_now(call.name)):
            return self.without_tool(call, st, message_seq)
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
            if not gate.request(self.sid, self.lease.fence, call.id, call.name, args, decision=decision):
                # Cancelled meanwhile: asking now would leave a request no one denies.
                return self.result(call, "cancelled: the turn was cancelled", True)
            self.view.refresh()
            return Waits.VERDICT
        if decision.action == "park":
            return Waits.VERDICT
        if decision.action == "deny":
            return self.result(call, f"denied: {decision.reason}", True)
        if decision.args is None:
            if defn.parks:
                return self.on_tasks(call, args, st)
            return self.invoke(defn, call, st, message_seq, edited=False)
        # Approved with edits: the reviewer's arguments run (and are what a
        # retry, a reconcile and the ledger see), not the model's.
        edited = ToolCall(call.id, call.name, json.dumps(decision.args, ensure_ascii=False))
        if defn.parks:
            return self.on_tasks(edited, decision.args, st, edited=True)
        return self.invoke(defn, edited, st, message_seq, edited=True)

    def on_tasks(self, call: ToolCall, args: dict[str, Any], st: TurnState, *, edited: bool = False) -> Waits | None:
        """task.start / task.wait: admitted and waited on by the owned-work
        store, keyed on the call (a resumed call finds its tasks); the turn
        parks while any it waits on is live."""
        self.flush()  # what is buffered precedes the admission's commit
        with tracing.tool(self.sid, call.name, call.id) as traced:
            got = waits.answer(self.sid, self.lease.fence, self.profile, call.name, call.id, args, st.events)
            traced.result(got is not None and got.is_error)
        if got is None:
            self.view.refresh()
            return Waits.TASKS
        self.view.refresh()
        return self.result(call, got.content, got.is_error, edited=edited)

    def unlisted_now(self, name: str) -> str | None:
        """An owed call's MCP tool, asked of its server again (once a drive):
        this process's listing may predate a server upgraded in place."""
        if name not in self._asked:
            self._asked[name] = unlisted_now(self.profile, name)
        return self._asked[name]

    def without_tool(self, call: ToolCall, st: TurnState, message_seq: int) -> Waits | None:
        """An owed call whose tool is gone: what its ledger settles without
        the tool (an operator's done or failed) is recorded, an attempt marked
        unknown waits for its operator, and anything else blocks the turn."""
        move = effects.without_definition(effects.ledgers(st.events, after=message_seq).get(call.id))
        if isinstance(move, effects.AwaitOperator):
            return Waits.OPERATOR
        if isinstance(move, effects.Settled):
            if move.via is not None:
                self.result(call, move.content, move.is_error, attempt=move.attempt, via=move.via)
            return None
        self.missing = definitions.missing_tool(call.name, self.profile, self.registry, self._asked.get(call.name))
        return Waits.DEFINITION

    def call_context(self, defn: Definition, args: dict[str, Any]) -> hooks.CallContext:
        return hooks.CallContext(self.sid, self.profile, defn, args, policy_known=True, policy_seq=self.view.policy_seq)

    # -- inline calls

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

    # -- external effects: the ledger's move, carried out

    def invoke(
        self, defn: Definition, call: ToolCall, st: TurnState, message_seq: int, *, edited: bool
    ) -> Waits | None:
        """Carry out the ledger's move for the call (effects.next_move): a
        new attempt, a result already known, or a wait for an operator."""
        ledger = effects.ledgers(st.events, after=message_seq).get(call.id)
        move = effects.next_move(ledger, defn)
        if isinstance(move, effects.Reconcile):
            move = effects.reconciled(move.attempt, self.ask_target(defn, call, message_seq, move.attempt))
        if isinstance(move, effects.Run):
            self.attempt(defn, call, st, message_seq, move, edited=edited)
        elif isinstance(move, effects.AwaitOperator):
            if move.reason is not None:
                unknown = {"call_id": call.id, "name": call.name, "attempt": move.attempt, "reason": move.reason}
                self.outbox.emit("tool/unknown", unknown)
            return Waits.OPERATOR
        elif move.via is not None:  # settled by an operator or the target; None: the log has it
            self.result(call, move.content, move.is_error, attempt=move.attempt, via=move.via, edited=edited)
        return None

    def attempt(
        self, defn: Definition, call: ToolCall, st: TurnState, message_seq: int, run: effects.Run, *, edited: bool
    ) -> None:
        """One attempt: its intent committed, the effect, its outcome buffered."""
        ctx = self.tool_context(call, message_seq, run.number)
        intent: dict[str, Any] = {
            "call_id": call.id,
            "name": call.name,
            "attempt": run.number,
            "idempotency_key": ctx.idempotency_key,
            "replay": defn.replay_policy,
            "fence": self.lease.gen,
            "worker": self.lease.owner,
        }
        if st.open_step is not None:
            intent["step"] = st.open_step
        if run.replaces is not None:
            intent["replaces"], intent["why"] = run.replaces, run.why
        if edited:
            intent["arguments"], intent["edited"] = call.arguments, True  # what actually runs
        self.outbox.emit("tool/attempt", intent)
        self.flush()  # the intent, and earlier results, are durable before the effect
        connection.close()  # tools may be slow; hold no connection meanwhile
        failpoints.pause("after_intent", defn.name)
        with tracing.tool(self.sid, call.name, call.id) as traced:
            outcome = execute(defn, ctx, call.arguments)
            traced.result(outcome.is_error)
        failpoints.pause("after_effect", defn.name)
        self.result(call, outcome.content, outcome.is_error, attempt=run.number, edited=edited)

    def ask_target(self, defn: Definition, call: ToolCall, message_seq: int, attempt: int) -> Reconciliation:
        """The tool's reconcile hook on `attempt`; a hook that raises cannot tell."""
        assert defn.reconcile is not None
        try:
            args = json.loads(call.arguments or "{}")
            connection.close()  # the target may be slow to answer
            return defn.reconcile(self.tool_context(call, message_seq, attempt), args)
        except Exception as exc:
            logger.warning("reconcile of %s in %s failed: %s", call.id, self.sid, exc, exc_info=True)
            return Reconciliation("unknown", f"its reconcile hook failed ({type(exc).__name__})")

    def tool_context(self, call: ToolCall, message_seq: int, attempt: int = 0) -> ToolContext:
        return ToolContext(
            self.sid,
            call.id,
            settings.TERRET_WORKSPACE_ROOT / self.sid.hex,
            idempotency_key=effects.idempotency_key(self.sid, message_seq, call.id),
            attempt=attempt,
            fence=self.lease.gen,
        )

    def result(
        self, call: ToolCall, content: str, is_error: bool, *, attempt: int = 0, via: str = "", edited: bool = False
    ) -> Waits | None:
        """Buffer the call's result; the call waits for nothing more (None)."""
        if edited:
            content = (
                f"(A reviewer edited the arguments before approving; the tool ran with {call.arguments})\n{content}"
            )
        kind, data = _result(call, content, is_error)
        if attempt:
            data["attempt"] = attempt
        if via:
            data["via"] = via
        self.outbox.emit(kind, data)
        return None


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
