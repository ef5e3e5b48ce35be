"""The effect ledger: every external effect's intent, outcome, and what a
resume may do about an attempt that has none.

Before a tool that is not inline runs, the runner commits `tool/attempt`
(the intent); the `tool/result` that follows names the attempt it closes.
A turn re-entered after a crash can therefore tell a call that never started
(no attempt) from one that may have had its effect (an attempt, no outcome).
For the latter it decides by the tool's replay policy, the one recorded at
the attempt and the one the tool declares now, whichever is stricter:

- `safe`: run it again, a new attempt under the same idempotency key;
- `reconcile`: ask the target (the tool's reconcile hook) and record its
  answer, run it again only if the target says it did not happen;
- `never`, or a target that cannot tell: `tool/unknown`, and the turn waits
  for an operator (tool/resolved: rerun, done or failed).

That decision is made here and only here, by two pure functions over the
call's ledger: `next_move(ledger, defn)` says what to do with a call (Run a
new attempt, Settled, AwaitOperator, or Reconcile: ask the target first),
and `reconciled(attempt, answer)` turns the target's answer into one of the
first three. runtime/calls.py carries a move out, the way DBOS's
invoke_step checks for a recorded result before a step and records one
after it: the intent committed, the effect, the outcome buffered, in one
function. `left_unknown` is the same ledger's rule for a turn that closes
around an attempt in flight (closing.py).

A host effect no model call made, a monitor's send of an edition
(sessions_app/monitors/run.py), is kept in the same ledger: its intent is a
`tool/attempt` naming the edition (`edition_id`), its outcome a
`tool/receipt` (not model-visible, where a tool call's would be a
`tool/result`), and an unknown one a `tool/unknown` that an operator answers
through the same resolution. `next_move` decides its moves too.

`effects_audit` checks the whole ledger of a session; the kill and chaos
tests run it after every round, and in production `audit_recent` runs it
from every worker's sweep on a bounded batch of recently active sessions,
keeping each one's findings (EffectAudit) for /ops/ and /metrics.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from sessions_app.log.records import LoggedEvent
from sessions_app.log.upcasters import lift
from sessions_app.models import EffectAudit, Event, Session
from sessions_app.tools.base import REPLAYS, Definition, Reconciliation, Replay

State = Literal["in_flight", "done", "failed", "unknown", "resolved", "superseded"]
# Why an attempt replaces one that had no outcome (tool/attempt `replaces`).
REASONS = {"safe": "safe", "not_done": "reconcile", "rerun": "never"}
OUTCOME_KINDS = ("tool/result", "tool/receipt")
LEDGER_KINDS = (
    "assistant/message",
    "tool/attempt",
    *OUTCOME_KINDS,
    "tool/unknown",
    "tool/resolved",
    "turn/start",
)


def idempotency_key(session_id: uuid.UUID, message_seq: int, call_id: str) -> str:
    """The same for every attempt of one call, on every worker; another for
    every other call (the message's seq tells apart providers that reuse
    call ids across replies)."""
    return f"terret:{session_id}:{message_seq}:{call_id}"


def stricter(recorded: str, current: Definition) -> Replay:
    """What a resume may do: the stricter of the policy the attempt was
    admitted under and the one the tool declares now. Replay safety is
    never assumed: a policy the log does not know counts as `never`."""
    now = current.replay_policy
    then: Replay = recorded if recorded in REPLAYS else "never"  # type: ignore[assignment]
    return max(then, now, key=REPLAYS.index)


@dataclass
class Attempt:
    """One attempt of one call, and what the log says became of it."""

    seq: int
    call_id: str
    name: str
    number: int
    data: dict[str, Any]
    result_seq: int | None = None
    result: dict[str, Any] | None = None
    unknown_seq: int | None = None
    resolution: dict[str, Any] | None = None
    resolution_seq: int | None = None
    at: datetime | None = None
    # The attempt that replaced this one, which had no outcome, and why.
    superseded_by: Attempt | None = None

    @property
    def state(self) -> State:
        if self.unknown_seq is not None:
            return "resolved" if self.resolution is not None else "unknown"
        if self.result is not None:
            return "failed" if self.result.get("is_error") else "done"
        if self.superseded_by is not None:
            return "superseded"
        return "in_flight"


@dataclass
class CallLedger:
    """The attempts of one call of an assistant message (the message at
    `after`: an attempt belongs to the latest message before it that made a
    call with its id)."""

    attempts: list[Attempt] = field(default_factory=list)

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


def ledgers(events: list[LoggedEvent], *, after: int = 0) -> dict[str, CallLedger]:
    """The attempts after seq `after` by call id, with their outcomes."""
    out: dict[str, CallLedger] = {}
    for e in events:
        if e.seq <= after:
            continue
        _apply(out, e)
    return out


def in_flight(events: list[tuple[LoggedEvent, datetime]]) -> list[Attempt]:
    """The attempts among `events` (each with its time) that have no outcome
    yet and were not replaced: tool calls running now, or whose worker died
    with them (runtime/progress.py shows them with their age)."""
    out: dict[str, CallLedger] = {}
    for e, at in events:
        _apply(out, e, at=at)
    return [a for ledger in out.values() for a in ledger.attempts if a.state == "in_flight"]


def _apply(out: dict[str, CallLedger], e: LoggedEvent, at: datetime | None = None) -> Attempt | None:
    if e.kind == "tool/attempt":
        a = Attempt(e.seq, e.data["call_id"], e.data["name"], e.data["attempt"], e.data, at=at)
        ledger = out.setdefault(a.call_id, CallLedger())
        replaced = e.data.get("replaces")
        for prior in ledger.attempts:
            if prior.number == replaced and prior.superseded_by is None:
                prior.superseded_by = a
        ledger.attempts.append(a)
        return a
    if e.kind not in (*OUTCOME_KINDS, "tool/unknown", "tool/resolved"):
        return None
    found = out.get(e.data["call_id"])
    number = e.data.get("attempt")
    if found is None or number is None:
        return None
    target = next((a for a in reversed(found.attempts) if a.number == number), None)
    if target is None:
        return None
    if e.kind in OUTCOME_KINDS and target.result is None:
        target.result, target.result_seq = e.data, e.seq
    elif e.kind == "tool/unknown" and target.unknown_seq is None:
        target.unknown_seq = e.seq
    elif e.kind == "tool/resolved" and target.resolution is None:
        target.resolution, target.resolution_seq = e.data, e.seq
    return target


# -- the replay decision ---------------------------------------------------

NOT_REPLAYABLE = "the worker stopped before its outcome was recorded, and the tool may not be re-run blindly"
TARGET_CANNOT_TELL = "its target could not tell whether it happened"


@dataclass(frozen=True)
class Run:
    """Run a new attempt: the first (`replaces` None), or one replacing
    attempt `replaces`, which had no outcome, for `why` (tool/attempt's
    `replaces` and `why`: safe, not_done or rerun)."""

    number: int
    replaces: int | None = None
    why: str | None = None


@dataclass(frozen=True)
class Settled:
    """The call's outcome is known. `via` says who told (an operator's
    resolution, the target's reconcile) and the result to record is
    `content`; `via` None: the attempt's own outcome is in the log already."""

    attempt: int
    via: Literal["operator", "reconcile"] | None = None
    content: str = ""
    is_error: bool = False


@dataclass(frozen=True)
class AwaitOperator:
    """An operator decides, and no further external attempt of the step
    starts meanwhile. `reason`: mark the attempt unknown with it first
    (tool/unknown); None: it is marked already."""

    attempt: int
    reason: str | None = None


@dataclass(frozen=True)
class Reconcile:
    """Ask the target about `attempt` (the tool's reconcile hook), then let
    `reconciled` decide on its answer."""

    attempt: int


Move = Run | Settled | AwaitOperator | Reconcile


def next_move(ledger: CallLedger | None, defn: Definition) -> Move:
    """What to do with a call, given its ledger (None: never attempted) and
    the tool as it is declared now. Pure: it reads nothing else and writes
    nothing; the caller carries the move out."""
    last = ledger.last if ledger else None
    if last is None:
        return Run(1)
    match last.state:
        case "done" | "failed":
            return Settled(last.number)
        case "unknown":
            return AwaitOperator(last.number)
        case "resolved":
            return _resolved(last)
    # In flight when its worker stopped: the effect may have happened. (A
    # superseded attempt is never the last: the one replacing it is.)
    policy = stricter(str(last.data.get("replay", "")), defn)
    if policy == "safe":
        return Run(last.number + 1, last.number, "safe")
    if policy == "reconcile" and defn.reconcile is not None:
        return Reconcile(last.number)
    return AwaitOperator(last.number, NOT_REPLAYABLE)


def _resolved(last: Attempt) -> Run | Settled:
    """An operator's resolution of an unknown attempt: rerun, done or failed."""
    resolution = last.resolution or {}
    action = resolution.get("action")
    if action == "rerun":
        return Run(last.number + 1, last.number, "rerun")
    content = str(resolution.get("result") or "")
    if action == "failed":
        by = f"failed: marked failed by an operator ({resolution.get('by', '')})"
        return Settled(last.number, "operator", f"{by}: {content}" if content else by, True)
    return Settled(last.number, "operator", content or "done (marked done by an operator)")


def without_definition(ledger: CallLedger | None) -> Settled | AwaitOperator | None:
    """The move for a call whose tool is gone (runtime/definitions.py), when
    the ledger makes it without the tool: an outcome on record or an
    operator's done/failed settles it, an attempt marked unknown waits for
    the operator still. None: only the tool can move it (a first attempt, a
    re-run, an attempt in flight), so the turn is blocked until it is back."""
    last = ledger.last if ledger else None
    if last is None:
        return None
    match last.state:
        case "done" | "failed":
            return Settled(last.number)
        case "unknown":
            return AwaitOperator(last.number)
        case "resolved":
            move = _resolved(last)
            return move if isinstance(move, Settled) else None
    return None


def reconciled(attempt: int, answer: Reconciliation) -> Run | Settled | AwaitOperator:
    """The move after the target answered about `attempt` (Reconcile)."""
    if answer.state == "not_done":
        return Run(attempt + 1, attempt, "not_done")
    if answer.state == "done":
        return Settled(attempt, "reconcile", answer.result)
    return AwaitOperator(attempt, answer.result or TARGET_CANNOT_TELL)


def left_unknown(last: Attempt) -> bool:
    """Whether a turn closing around `last` (closing.py) must mark it
    unknown: it was in flight, and re-running it blindly was not safe as
    recorded, so what it did stays an operator's question. (Closing has no
    tool definition at hand: the cancel service closes turns too.)"""
    return last.state == "in_flight" and last.data.get("replay") != "safe"


# -- reading the whole ledger of a session (operators, the audit) ----------


@dataclass(frozen=True)
class Effect:
    """One attempt as an operator sees it."""

    call_id: str
    tool: str
    attempt: int
    state: State
    replay: str
    idempotency_key: str
    arguments: str
    step: int | None
    worker: str
    fence: int
    attempted_at: datetime | None
    attempt_seq: int
    turn_seq: int
    turn_open: bool
    result: str | None
    resolution: dict[str, Any] | None
    # A host effect's: the monitor edition whose send this attempt is (None: a tool call).
    edition_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "attempt": self.attempt,
            "state": self.state,
            "replay": self.replay,
            "idempotency_key": self.idempotency_key,
            "arguments": self.arguments,
            "step": self.step,
            "worker": self.worker,
            "fence": self.fence,
            "attempted_at": self.attempted_at.isoformat() if self.attempted_at else None,
            "attempt_seq": self.attempt_seq,
            "turn_seq": self.turn_seq,
            "turn_open": self.turn_open,
            "result": self.result,
            "resolution": self.resolution,
            "edition_id": self.edition_id,
        }


@dataclass
class _Scan:
    """One pass over a session's ledger events, in seq order."""

    # Each attempt with its turn's seq, the seq of the message that made the
    # call (a call is its message and its id: providers reuse ids), the arguments.
    attempts: list[tuple[Attempt, int, int, str]] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    double_results: list[str] = field(default_factory=list)
    turns_open: set[int] = field(default_factory=set)


def _scan(session_id: uuid.UUID | str) -> _Scan:
    scan = _Scan()
    rows = (
        Event.objects.filter(session_id=session_id, kind__in=(*LEDGER_KINDS, "turn/end"))
        .order_by("seq")
        .values_list("seq", "kind", "data", "created_at", "version")
        .iterator(chunk_size=2000)
    )
    turn_seq = 0
    ledger: dict[str, CallLedger] = {}
    arguments: dict[str, str] = {}
    made_by: dict[str, int] = {}
    for seq, kind, data, created_at, version in rows:
        e = LoggedEvent(seq, kind, lift(kind, version, data))
        if kind == "turn/start":
            turn_seq, ledger = seq, {}
            scan.turns_open.add(seq)
            continue
        if kind == "turn/end":
            scan.turns_open.discard(turn_seq)
            continue
        if kind == "assistant/message":
            for call in data.get("tool_calls") or []:
                arguments[call["id"]] = call["arguments"]
                made_by[call["id"]] = seq
                ledger.pop(call["id"], None)  # a reused id starts a new call
            continue
        if kind in OUTCOME_KINDS and "attempt" in data:
            prior = ledger.get(data["call_id"])
            match = next((a for a in prior.attempts if a.number == data["attempt"]), None) if prior else None
            if match is None:
                scan.orphans.append(
                    f"seq {seq}: {kind} for {data['call_id']} names attempt {data['attempt']}, which was never recorded"
                )
                continue
            if match.result is not None:
                scan.double_results.append(f"seq {seq}: a second outcome for attempt {match.number} of {match.call_id}")
                continue
        attempt = _apply(ledger, e, at=created_at)
        if kind == "tool/attempt" and attempt is not None:
            scan.attempts.append(
                (attempt, turn_seq, made_by.get(attempt.call_id, 0), arguments.get(attempt.call_id, ""))
            )
    return scan


def effects(session_id: uuid.UUID | str) -> list[Effect]:
    """Every attempt of the session, oldest first, with its state."""
    scan = _scan(session_id)
    return [_effect(a, turn_seq, turn_seq in scan.turns_open, args) for a, turn_seq, _, args in scan.attempts]


_CALL_KINDS = ("tool/attempt", *OUTCOME_KINDS, "tool/unknown", "tool/resolved")


def call_ledger(session_id: uuid.UUID | str, call_id: str) -> CallLedger | None:
    """One call's ledger from its own events alone (a bounded read): for a
    host effect, whose call id no assistant message reuses."""
    rows = (
        Event.objects.filter(session_id=session_id, kind__in=_CALL_KINDS, data__call_id=call_id)
        .order_by("seq")
        .values_list("seq", "kind", "data", "version")
    )
    return ledgers([LoggedEvent(seq, kind, lift(kind, version, data)) for seq, kind, data, version in rows]).get(
        call_id
    )


def call_effects(session_id: uuid.UUID | str, call_id: str) -> list[Effect]:
    """The attempts of one call id, oldest first: a bounded read (the call's
    own ledger events, then two index lookups per attempt for its turn and
    its message), where `effects` reads the session's whole ledger."""
    rows = (
        Event.objects.filter(session_id=session_id, kind__in=_CALL_KINDS, data__call_id=call_id)
        .order_by("seq")
        .values_list("seq", "kind", "data", "created_at", "version")
    )
    ledger: dict[str, CallLedger] = {}
    attempts: list[Attempt] = []
    for seq, kind, data, created_at, version in rows:
        found = _apply(ledger, LoggedEvent(seq, kind, lift(kind, version, data)), at=created_at)
        if kind == "tool/attempt" and found is not None:
            attempts.append(found)
    if not attempts:
        return []
    open_turn = Session.objects.filter(id=session_id).values_list("open_turn_seq", flat=True).first()
    out = []
    for a in attempts:
        before = Event.objects.filter(session_id=session_id, seq__lt=a.seq).order_by("-seq")
        turn_seq = before.filter(kind="turn/start").values_list("seq", flat=True).first() or 0
        message = before.filter(kind="assistant/message").values_list("data", flat=True).first() or {}
        args = next((c["arguments"] for c in message.get("tool_calls") or [] if c["id"] == call_id), "")
        out.append(_effect(a, turn_seq, turn_seq == open_turn, args))
    return out


def _effect(a: Attempt, turn_seq: int, turn_open: bool, args: str) -> Effect:
    return Effect(
        call_id=a.call_id,
        tool=a.name,
        attempt=a.number,
        state=a.state,
        replay=str(a.data.get("replay", "")),
        idempotency_key=str(a.data.get("idempotency_key", "")),
        # A reviewer's edit: the attempt names the arguments that ran.
        arguments=str(a.data.get("arguments", args)),
        step=a.data.get("step"),
        worker=str(a.data.get("worker", "")),
        fence=int(a.data.get("fence", 0)),
        attempted_at=a.at,
        attempt_seq=a.seq,
        turn_seq=turn_seq,
        turn_open=turn_open,
        result=None if a.result is None else str(a.result.get("content", "")),
        resolution=a.resolution,
        edition_id=a.data.get("edition_id"),
    )


@dataclass(frozen=True)
class Audit:
    """The effect audit of one session: counts by state, and what is wrong."""

    counts: dict[str, int]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def effects_audit(session_id: uuid.UUID | str) -> Audit:
    """Every attempt is in exactly one state: an intent with an outcome
    (done, failed), an intent marked unknown and resolved, an intent marked
    unknown and pending, an intent without outcome that a later attempt
    replaced for a recorded reason (superseded), or (only while its turn is
    open) in flight. A host effect's attempt (a monitor's send) belongs to
    no turn: in flight it is being sent, or its worker died and the
    monitor's clock settles it (a re-send that supersedes it, or unknown).
    No outcome names an attempt that was never recorded, no attempt has two
    outcomes, and a call runs again only as its policy
    allows: a `safe` tool by itself, a `reconcile` tool when its target said
    not done, any other only after an operator's rerun."""
    scan = _scan(session_id)
    problems = [*scan.orphans, *scan.double_results]
    counts: Counter[str] = Counter()
    by_call: dict[tuple[int, str], list[Attempt]] = {}
    for a, turn_seq, message_seq, _ in scan.attempts:
        counts[a.state] += 1
        by_call.setdefault((message_seq, a.call_id), []).append(a)
        if a.state == "in_flight" and turn_seq not in scan.turns_open and "edition_id" not in a.data:
            problems.append(f"attempt {a.number} of {a.call_id} (seq {a.seq}) has no outcome, and its turn is closed")
    for (_, call_id), attempts in by_call.items():
        for before, after in itertools.pairwise(attempts):
            if after.number != before.number + 1:
                problems.append(f"{call_id}: attempt {after.number} follows attempt {before.number}")
            if before.result_seq is not None and before.result_seq < after.seq:
                problems.append(f"{call_id}: attempt {after.number} runs after attempt {before.number} had an outcome")
            problems.extend(_replay_problems(call_id, before, after))
    counts["calls"] = len(by_call)
    return Audit(dict(counts), problems)


def _replay_problems(call_id: str, before: Attempt, after: Attempt) -> list[str]:
    """Whether `after` was allowed to run, given `before`."""
    why = after.data.get("why")
    if after.data.get("replaces") != before.number or why not in REASONS:
        return [f"{call_id}: attempt {after.number} does not say which attempt it replaces, or why"]
    rerun = (before.resolution or {}).get("action") == "rerun"
    if why == "rerun":
        return [] if rerun else [f"{call_id}: attempt {after.number} claims an operator's rerun that is not on record"]
    if before.state != "superseded":
        return [f"{call_id}: attempt {after.number} replaces attempt {before.number}, which is {before.state}"]
    # The reason's policy must be at least as strict as the one recorded: a
    # safe tool may be reconciled, a `never` tool is never replayed by itself.
    policy = str(before.data.get("replay"))
    if policy not in REPLAYS or REPLAYS.index(REASONS[why]) < REPLAYS.index(policy):  # type: ignore[arg-type]
        return [f"{call_id}: a `{policy}` tool ran again (attempt {after.number}) as if it were `{REASONS[why]}`"]
    return []


def due_for_audit(limit: int) -> list[tuple[uuid.UUID, int]]:
    """(session id, log head) of at most `limit` sessions active within
    TERRET_EFFECTS_AUDIT_HOURS whose log moved on since their last audit
    (or that have none), the longest waiting first. Only sessions with no
    open turn: a running turn's ledger is still moving (its audit would be
    redone at every step, by every worker's sweep), and it is audited once
    its turn has ended."""
    since = timezone.now() - timedelta(hours=settings.TERRET_EFFECTS_AUDIT_HOURS)
    moved = Q(effect_audit__isnull=True) | Q(last_seq__gt=F("effect_audit__audited_seq"))
    rows = Session.objects.filter(moved, last_event_at__gte=since, open_turn_seq__isnull=True)
    rows = rows.order_by("last_event_at")
    return list(rows.values_list("id", "last_seq")[:limit])


def audit_recent(limit: int | None = None) -> tuple[int, int]:
    """Audit the effect ledgers of a bounded batch of recently active
    sessions (due_for_audit) and keep what each audit found. Returns
    (sessions audited, problems found). The head is read before the ledger:
    events appended meanwhile make the session due again, never missed."""
    limit = settings.TERRET_EFFECTS_AUDIT_BATCH if limit is None else limit
    audited = found = 0
    for session_id, head in due_for_audit(limit) if limit > 0 else []:
        audit = effects_audit(session_id)
        EffectAudit.objects.update_or_create(
            session_id=session_id,
            defaults={
                "audited_seq": head,
                "audited_at": timezone.now(),
                "problems": audit.problems,
                "found": len(audit.problems),
                "counts": audit.counts,
            },
        )
        audited += 1
        found += len(audit.problems)
    return audited, found
