"""Request and response shapes. The OpenAPI document is generated from these,
and the socket validates its client frames with the same input models.

Inputs are strict (no coercion: "true" is not a boolean, 1 is not a string)
and closed (unknown fields are refused), so a typo is an error, not a no-op.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sessions_app.log.catalogue import MODEL_ROLES, RESOLUTIONS
from sessions_app.services import MAX_INPUT_CHARS
from sessions_app.services.budgets import MAX_COST_USD, MAX_COUNT
from sessions_app.services.effects import MAX_REASON_CHARS as MAX_RESOLVE_REASON_CHARS
from sessions_app.services.effects import MAX_RESULT_CHARS
from sessions_app.services.operators import MAX_REASON_CHARS as MAX_OPS_REASON_CHARS
from sessions_app.validation import json_problem

MAX_KEY_CHARS = 200
MAX_REASON_CHARS = 2000
MAX_CALL_ID_CHARS = 200
MAX_PATTERNS = 100
MAX_PATTERN_CHARS = 200

Role = Literal["main", "titler", "compactor"]
assert set(MODEL_ROLES) == {"main", "titler", "compactor"}  # keep the Literal in step
Resolution = Literal["rerun", "done", "failed"]
assert set(RESOLUTIONS) == {"rerun", "done", "failed"}  # keep the Literal in step
# Session.status: idle (no open turn), running, waiting_approval (a call is
# parked), waiting_reconcile (an attempt of the open turn has an unknown
# outcome and waits for an operator; see /effects), blocked (the open turn
# stopped retrying by itself; see /retry), suspended or revoked (an operator
# holds the open turn's session: services/operators.py).
Status = Literal["idle", "running", "waiting_approval", "waiting_reconcile", "blocked", "suspended", "revoked"]
EffectState = Literal["in_flight", "done", "failed", "unknown", "resolved", "superseded"]
BudgetName = Literal["cost_usd", "tokens", "steps", "turns"]
BudgetScope = Literal["session", "profile", "global"]

Text = Annotated[str, Field(min_length=1, max_length=MAX_INPUT_CHARS)]
Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)]
Reason = Annotated[str, Field(max_length=MAX_REASON_CHARS)]
CallId = Annotated[str, Field(min_length=1, max_length=MAX_CALL_ID_CHARS)]
Pattern = Annotated[str, Field(min_length=1, max_length=MAX_PATTERN_CHARS)]
Seq = Annotated[int, Field(ge=1)]


class In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        # PostgreSQL cannot store NUL in text or jsonb, nor UTF-8 encode a lone
        # surrogate (in a free-form field such as edited_args): refuse either
        # up front with a 4xx instead of failing deep inside a query.
        problem = json_problem(data)
        if problem is not None:
            raise ValueError(f"strings {problem}")
        return data


# ---------------------------------------------------------------- HTTP inputs


class CreateSessionIn(In):
    profile: Annotated[str, Field(min_length=1, max_length=64)]


LaneName = Literal["steer", "follow_up", "passive"]
StrategyName = Literal["reject", "enqueue", "interrupt"]


class InputIn(In):
    text: Text
    wake: bool = True
    lane: LaneName | None = Field(
        None,
        description="steer: ride the running turn's next step; follow_up: a turn of its own once the running one "
        "ends; passive: start nothing, seen by the next turn. Default: steer while a turn runs, a new turn when idle",
    )
    multitask_strategy: StrategyName | None = Field(
        None,
        description="What input that would start a turn does while one runs: reject (409), enqueue (a follow-up), "
        "interrupt (cancel the running turn; this input opens the next)",
    )


class ScheduleIn(In):
    due_at: Annotated[str, Field(max_length=64)] | None = None
    every_seconds: Annotated[int, Field(ge=1)] | None = None
    cron: Annotated[str, Field(min_length=1, max_length=120)] | None = None
    text: Text
    misfire: Literal["skip", "run_once", "reschedule"] = "run_once"
    max_runs: Annotated[int, Field(ge=1)] | None = None
    idempotency_key: Key | None = None
    reason: Annotated[str, Field(max_length=200)] | None = None
    budget_tokens: Annotated[int, Field(ge=1)] | None = None


class DecisionIn(In):
    verdict: Literal["approve", "deny"]
    reason: Reason | None = None
    request_seq: Seq | None = None
    # approve only: the arguments to run instead of the model's (checked against the tool's schema)
    edited_args: dict[str, Any] | None = None
    # approve only: let this tool run without asking for the rest of the session
    allow_for_session: bool = False


class PolicyIn(In):
    patterns: Annotated[list[Pattern], Field(max_length=MAX_PATTERNS)]


class ResolveIn(In):
    """An operator's answer to an attempt of unknown outcome."""

    action: Resolution = Field(
        description="rerun: run the call again (a new attempt, same idempotency key; its turn must be open); "
        "done: it happened, `result` is what the model sees; failed: it did not, or it must count as an error"
    )
    result: Annotated[str, Field(max_length=MAX_RESULT_CHARS)] | None = Field(
        None, description="done or failed only: the tool result recorded for the call"
    )
    reason: Annotated[str, Field(max_length=MAX_RESOLVE_REASON_CHARS)] | None = None


CostLimit = Annotated[float, Field(ge=0, le=float(MAX_COST_USD))]
CountLimit = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class BudgetIn(In):
    """The session's four limits, each over its whole life. Every field is
    required; null means no limit."""

    cost_usd: CostLimit | None = Field(description="US dollars (kept to 6 decimal places), or null")
    tokens: CountLimit | None = Field(description="prompt plus completion tokens, or null")
    steps: CountLimit | None = Field(description="model steps, or null")
    turns: CountLimit | None = Field(description="turns, or null")


OpsReason = Annotated[str, Field(max_length=MAX_OPS_REASON_CHARS)]


class ScopeIn(In):
    """What an operator suspends or resumes: everything, one profile, or one session."""

    scope: Literal["global", "profile", "session"]
    target: Annotated[str, Field(max_length=64)] = Field(
        "", description="the profile's name, or the session's id; empty for global"
    )
    reason: OpsReason = ""


class ReasonIn(In):
    """An operator's action on one session, with why (the operators' log keeps it)."""

    reason: OpsReason = ""


ForkPolicy = Literal["historical", "current", "fresh"]


class ForkIn(In):
    """Fork the session as of a seq of its log (docs/events.md, "Forks")."""

    at_seq: Annotated[int, Field(ge=0, le=2**62)] = Field(
        description="a fork point of the parent's log: no step open as of it"
    )
    policy: ForkPolicy = Field(description="what the fork inherits: as of at_seq, as of now, or nothing")


# ---------------------------------------------------------------- socket frames


class ClientFrame(In):
    id: Annotated[str, Field(max_length=64)] | int | None = None


class InjectFrame(ClientFrame):
    type: Literal["inject"]
    text: Text
    wake: bool = True
    idempotency_key: Key | None = None
    lane: LaneName | None = None
    multitask_strategy: StrategyName | None = None


class WithdrawFrame(ClientFrame):
    type: Literal["withdraw"]
    seq: Seq


class ScheduleFrame(ClientFrame):
    type: Literal["schedule"]
    schedule: ScheduleIn


class CancelScheduleFrame(ClientFrame):
    type: Literal["cancel_schedule"]
    schedule_id: Annotated[str, Field(min_length=1, max_length=64)]


class DecisionFrame(ClientFrame):
    type: Literal["approve", "deny"]
    call_id: CallId
    reason: Reason | None = None
    request_seq: Seq | None = None
    edited_args: dict[str, Any] | None = None
    allow_for_session: bool = False


class BareFrame(ClientFrame):
    type: Literal["cancel", "retry", "compact", "ping"]


class PolicyFrame(ClientFrame):
    type: Literal["set_policy"]
    patterns: Annotated[list[Pattern], Field(max_length=MAX_PATTERNS)]


class ModelFrame(ClientFrame):
    type: Literal["set_model"]
    role: Role
    spec: Annotated[str, Field(min_length=1, max_length=200)]


class BudgetFrame(ClientFrame):
    type: Literal["budget"]
    limit: BudgetIn


class ForkFrame(ClientFrame):
    type: Literal["fork"]
    at_seq: Annotated[int, Field(ge=0, le=2**62)]
    policy: ForkPolicy


FRAMES: dict[str, type[ClientFrame]] = {
    "inject": InjectFrame,
    "approve": DecisionFrame,
    "deny": DecisionFrame,
    "cancel": BareFrame,
    "retry": BareFrame,
    "compact": BareFrame,
    "ping": BareFrame,
    "set_policy": PolicyFrame,
    "set_model": ModelFrame,
    "budget": BudgetFrame,
    "withdraw": WithdrawFrame,
    "schedule": ScheduleFrame,
    "cancel_schedule": CancelScheduleFrame,
    "fork": ForkFrame,
}


# ---------------------------------------------------------------- outputs


class ErrorOut(Schema):
    code: str
    message: str


class ProfileOut(Schema):
    name: str
    description: str


class ProfilesOut(Schema):
    profiles: list[ProfileOut]


class CreatedOut(Schema):
    id: str
    profile: str
    status: Status


class ForkOut(Schema):
    """The new session a fork made, and where it came from."""

    id: str
    profile: str | None
    status: Status
    parent: str
    at_seq: int = Field(description="the fork point used")
    requested_seq: int | None = Field(description="the seq asked for, when the fork point was taken back to it")
    policy: ForkPolicy
    last_seq: int = Field(description="the fork's head: the end of its seed")


class ForkErrorOut(Schema):
    """`invalid_fork_point` (422): the nearest fork points, null where there is none yet."""

    code: str
    message: str
    before: int | None = None
    after: int | None = None


class UsageOut(Schema):
    prompt_tokens: int
    completion_tokens: int
    cost: float
    steps: int
    unpriced: int


class PendingOut(Schema):
    call_id: str
    name: str
    args: dict[str, Any]
    seq: int


class BlockedOut(Schema):
    """Why the open turn stopped retrying by itself (its turn/blocked)."""

    reason: str
    attempts: int
    code: str | None = Field(
        None,
        description="retries_exhausted (a resumed turn kept failing) or context_overflow (compaction could not "
        "bring the request under the model's context window); null for a turn blocked before codes",
    )
    since: str = Field(description="ISO 8601: when the turn was blocked")


class WaitingOut(Schema):
    """The session has work but every live agent slot is busy (its agent/waiting)."""

    reason: str
    since: str = Field(description="ISO 8601: since when the session waits")


class BudgetLimitOut(Schema):
    """The session's own limits (null: no limit)."""

    cost_usd: float | None
    tokens: int | None
    steps: int | None
    turns: int | None


class BudgetSpentOut(Schema):
    """What the session has spent over its whole life."""

    cost_usd: float
    tokens: int = Field(description="prompt plus completion tokens")
    steps: int
    turns: int
    unpriced: int = Field(
        description="usage entries of unknown price: while above 0 a cost budget cannot be enforced and counts "
        "as exhausted (unpriced is never $0)"
    )


class ExhaustedOut(Schema):
    """The first budget that keeps a new turn from starting."""

    budget: BudgetName
    scope: BudgetScope = Field(description="session; profile (its UTC day); global (the installation's UTC day)")
    limit: int | float
    spent: int | float
    unpriced: int | None = Field(None, description="set when a cost budget cannot be enforced: unpriced entries")
    message: str = Field(description="the same in words")


class BudgetOut(Schema):
    limit: BudgetLimitOut
    spent: BudgetSpentOut
    exhausted: ExhaustedOut | None = Field(
        description="null while every budget (session, profile's day, global day) allows a new turn"
    )


class SessionOut(Schema):
    id: str
    profile: str | None
    status: Status
    blocked: BlockedOut | None = Field(description="set when status is blocked")
    waiting: WaitingOut | None = Field(description="set while the session's work waits for an agent slot")
    unknown_effects: int = Field(
        description="attempts of the open turn whose outcome is unknown and that no operator has resolved "
        "(status waiting_reconcile while above 0); GET …/effects lists them"
    )
    title: str
    usage: UsageOut
    last_seq: int
    pending_approvals: list[PendingOut]
    budget: BudgetOut = Field(description="as GET …/budget answers")


class ReceiptOut(Schema):
    disposition: Literal["started", "queued", "held", "placed", "answered", "withdrawn"] = Field(
        description="started: it opened a turn; queued: it waits in its lane; held: a budget or a suspension "
        "keeps a new turn from starting, so it is kept until that allows; placed: a turn took it into the "
        "transcript (placed_seq); answered: that turn ended (answered_seq); withdrawn: its owner took it back"
    )
    seq: int
    turn_seq: int | None
    idempotency_key: str | None
    replayed: bool
    held_reason: str | None = Field(None, description="held only: which budget holds it, in words")
    lane: LaneName | None = None
    placed_seq: int | None = None
    answered_seq: int | None = None


class ScheduleOut(Schema):
    id: str
    session_id: str
    status: Literal["pending", "claimed", "completed", "skipped", "failed", "cancelled", "paused"]
    status_reason: str
    text: str
    reason: str
    due_at: str | None
    next_due_at: str | None
    every_seconds: int | None
    cron: str | None
    misfire: Literal["skip", "run_once", "reschedule"]
    max_runs: int | None
    runs: int
    skipped: int
    budget_tokens: int | None
    spent_tokens: int
    idempotency_key: str | None
    last_outcome: dict[str, Any] | None = Field(
        description="The latest firing: outcome ran | late | skipped, at, due_at, late_seconds, and reason when skipped"
    )
    created_by: str
    created_at: str


class SchedulesOut(Schema):
    schedules: list[ScheduleOut]


class EventOut(Schema):
    seq: int
    kind: str
    data: dict[str, Any]
    at: str


class EventsOut(Schema):
    events: list[EventOut]
    last_seq: int


class SessionSummaryOut(Schema):
    id: str
    profile: str | None
    title: str
    status: Status
    created_at: str = Field(description="ISO 8601")
    last_event_at: str | None = Field(description="ISO 8601; null before the first event")
    last_seq: int
    pending_approvals: int = Field(description="calls of the open turn waiting for a verdict")
    archived: bool
    cost: float = Field(description="USD, priced steps only (GET /api/sessions/{id} has the unpriced count)")


class SessionListOut(Schema):
    sessions: list[SessionSummaryOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last page")


class DecisionOut(Schema):
    call_id: str
    verdict: Literal["approve", "deny"]
    seq: int
    # the arguments that will run when a reviewer edited them (null: the model's own)
    edited_args: dict[str, Any] | None = None
    allowed_for_session: bool = False


class PolicyOut(Schema):
    patterns: list[str]
    seq: int


class CancelOut(Schema):
    cancelled: bool = Field(description="false when no turn was open")
    closed: bool = Field(
        description="true when the cancelled turn has already ended (no worker held it); "
        "false when a worker is stopping it (within about a second) or nothing was cancelled"
    )


class RetryOut(Schema):
    status: Status = Field(description="the session's status once the retry was requested")


class CompactOut(Schema):
    compacted: bool
    seq: int | None
    upto_seq: int | None
    reason: str | None


class EffectOut(Schema):
    """One attempt of one tool call, from the effect ledger."""

    call_id: str
    tool: str
    attempt: int = Field(description="1 for the first attempt of the call, +1 for each re-run")
    state: EffectState = Field(
        description="in_flight (its turn is open and no outcome yet), done, failed, unknown (waits for an "
        "operator), resolved (an operator answered it)"
    )
    replay: str = Field(description="the replay policy the attempt was admitted under: safe, reconcile or never")
    idempotency_key: str = Field(description="the same for every attempt of the call")
    arguments: str = Field(description="the call's arguments, as the model sent them (a JSON string)")
    step: int | None
    worker: str = Field(description="the worker that made the attempt")
    fence: int = Field(description="the lease generation the attempt ran under")
    attempted_at: str | None = Field(description="ISO 8601: when the attempt was recorded")
    attempt_seq: int = Field(description="the seq of its tool/attempt event")
    turn_seq: int = Field(description="the seq of its turn's turn/start")
    turn_open: bool
    result: str | None = Field(description="the content of its tool/result, if it has one")
    resolution: dict[str, Any] | None = Field(description="its tool/resolved payload, once resolved")


class EffectsOut(Schema):
    effects: list[EffectOut] = Field(description="every attempt of the session, oldest first")
    pending: int = Field(description="how many are in state unknown (waiting for an operator)")


class ResolveOut(Schema):
    resolved: EffectOut = Field(description="the attempt that was resolved, as it was before the resolution")
    status: Status = Field(description="the session's status once the resolution was recorded")


class AttentionItemOut(Schema):
    kind: str = Field(description="blocked, suspended, revoked, held_input, approval, expired_lease, unknown_effects")
    session_id: str | None = Field(description="null for a profile's or the global suspension")
    title: str
    since: str | None = Field(description="ISO 8601")
    age_seconds: float | None
    detail: dict[str, Any]


class AttentionOut(Schema):
    attention: dict[str, list[AttentionItemOut]] = Field(
        description="by kind (blocked, suspended, revoked, held_input, approvals oldest first, expired_leases, "
        "unknown_effects), each at most 200"
    )
    counts: dict[str, int]


class OpsOut(Schema):
    ok: bool
    woken: int | None = Field(None, description="resume only: how many held sessions were woken")


class SessionActionOut(Schema):
    ok: bool
    status: Status = Field(description="the session's status once the action was recorded")
