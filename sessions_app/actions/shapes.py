"""The shapes of what a client sends, on every door that takes JSON: the
API's request bodies and the session socket's client frames (one protocol,
two doors, so the shapes sit beneath both; api/schemas.py shapes the API's
answers, and the OpenAPI document is generated from both).

Inputs are strict (no coercion: "true" is not a boolean, 1 is not a string)
and closed (unknown fields are refused), so a typo is an error, not a no-op.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

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
# holds the open turn's session: services/operators.py), waiting_task (the open
# turn is parked on owned tasks until their terminal receipts: runtime/owned/).
Status = Literal[
    "idle", "running", "waiting_approval", "waiting_task", "waiting_reconcile", "blocked", "suspended", "revoked"
]
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
    expires_at: Annotated[str, Field(max_length=64)] | None = None
    idempotency_key: Key | None = None
    reason: Annotated[str, Field(max_length=200)] | None = None
    budget_tokens: Annotated[int, Field(ge=1)] | None = None


class MonitorScheduleIn(In):
    every_seconds: Annotated[int, Field(ge=1)] | None = None
    cron: Annotated[str, Field(min_length=1, max_length=120)] | None = None
    misfire: Literal["skip", "run_once", "reschedule"] = "run_once"


class MonitorSourceIn(In):
    kind: Literal["feed", "http_json", "mcp"]
    url: Annotated[str, Field(min_length=1, max_length=2000)] | None = None
    # mcp only: a server of the session's profile, its tool, the tool's arguments, the continuation's argument
    server: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    tool: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    arguments: dict[str, Any] | None = None
    cursor_arg: Annotated[str, Field(max_length=200)] | None = None
    partition: Annotated[str, Field(min_length=1, max_length=120)] | None = None
    name: Annotated[str, Field(min_length=1, max_length=300)] | None = None
    initial: Literal["all", "now"] | None = None
    overlap_seconds: Annotated[int, Field(ge=0, le=2592000)] | None = None
    # http_json only: dotted paths into the answer and its items, and the paging parameters
    items: Annotated[str, Field(max_length=200)] | None = None
    id: Annotated[str, Field(max_length=200)] | None = None
    version: Annotated[str, Field(max_length=200)] | None = None
    title: Annotated[str, Field(max_length=200)] | None = None
    link: Annotated[str, Field(max_length=200)] | None = None
    time: Annotated[str, Field(max_length=200)] | None = None
    cursor_param: Annotated[str, Field(max_length=200)] | None = None
    next_cursor: Annotated[str, Field(max_length=200)] | None = None
    since_param: Annotated[str, Field(max_length=200)] | None = None


class MonitorDestinationIn(In):
    kind: Literal["webhook", "email", "session"]
    url: Annotated[str, Field(min_length=1, max_length=2000)] | None = None
    to: (
        Annotated[list[Annotated[str, Field(min_length=3, max_length=254)]], Field(min_length=1, max_length=20)] | None
    ) = None


class MonitorIn(In):
    schedule: MonitorScheduleIn
    sources: Annotated[list[MonitorSourceIn], Field(min_length=1, max_length=20)]
    destination: MonitorDestinationIn
    quiet: Literal["suppress", "send"] = "suppress"
    digest: Literal["host", "model"] = "host"
    idempotency_key: Key | None = None


class EditionResolveIn(In):
    """The effect resolution of an edition's send, reached by the edition (ResolveIn's alias)."""

    action: Literal["rerun", "done", "failed"]
    receipt: Annotated[str, Field(max_length=300)] | None = None
    reason: Reason | None = None


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


class NotificationsIn(In):
    """The signed-in person's notification settings; a field left out is kept."""

    email: bool | None = Field(None, description="email me at my account's address")
    webhook_url: Annotated[str, Field(max_length=2000)] | None = Field(
        None, description="an http(s) URL to POST signed notifications to; empty or null removes the webhook"
    )
    webhook_secret: Annotated[str, Field(max_length=200)] | None = Field(
        None, description="the HMAC-SHA256 key, 16 to 200 characters; write-only (null: keep the current one)"
    )


class UpgradeIn(In):
    """Move the session to another version of its profile (docs/protocol.md, "Agent versions")."""

    to: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = Field(
        None, description="a version number of the session's profile; null: the newest"
    )


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


class DocumentIn(In):
    """Write a document as the session's owner: its next version, or a new
    document (docs/documents.md)."""

    content: str = Field(description="the content: UTF-8 text, or base64 with encoding=base64")
    encoding: Literal["utf-8", "base64"] = "utf-8"
    kind: Annotated[str, Field(min_length=1, max_length=32)] = Field(
        default="file", description="file, json, or another kind kept as opaque data (a new document only)"
    )
    scope: Literal["session", "conversation", "task"] = Field(default="conversation", description="a new document only")
    schema_name: Annotated[str, Field(max_length=200)] = Field(
        default="", alias="schema", description="a json document's registered schema (a new document only)"
    )
    schema_version: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    task: Annotated[str, Field(max_length=200)] = Field(default="", description="a task-scoped document's task")
    incarnation: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = Field(
        default=None, description="the incarnation the writer read: 409 document_conflict if it was recreated"
    )
    version: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = Field(
        default=None, description="with incarnation: the version the writer read (409 if written since)"
    )


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
