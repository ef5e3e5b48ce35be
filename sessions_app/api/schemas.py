"""The API's response shapes (its request shapes are the protocol's, in
sessions_app/actions/shapes.py, which the socket's frames share). The
OpenAPI document is generated from both.
"""

from __future__ import annotations

from typing import Any, Literal

from ninja import Schema
from pydantic import Field

from sessions_app.actions import Resolved
from sessions_app.actions.shapes import (  # noqa: F401 - the request shapes, re-exported for the API's views
    FRAMES,
    BudgetIn,
    BudgetName,
    BudgetScope,
    ClientFrame,
    CreateSessionIn,
    DecisionIn,
    DocumentIn,
    EditionResolveIn,
    EffectState,
    ForkIn,
    ForkPolicy,
    InputIn,
    LaneName,
    MonitorIn,
    NotificationsIn,
    PolicyIn,
    ReasonIn,
    ResolveIn,
    Role,
    ScheduleIn,
    ScopeIn,
    Status,
    UpgradeIn,
)
from sessions_app.models import AgentProfile as ProfileRow
from sessions_app.models import Edition as EditionRow
from sessions_app.models import Monitor as MonitorRow
from sessions_app.models import Schedule as ScheduleRow
from sessions_app.models import Session as SessionRow
from sessions_app.services import forks, monitors, schedules
from sessions_app.services.effects import Effect

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


class DocumentOut(Schema):
    """A document's version as listed (its head, unless a version was asked for)."""

    name: str = Field(description="its path, relative to the workspace")
    kind: str = Field(description="file, json, or another kind kept as opaque data")
    scope: Literal["session", "conversation", "task"]
    incarnation: int = Field(description="which life of the name: a recreated document counts on")
    version: int
    size: int = Field(description="bytes")
    sha256: str
    seq: int = Field(description="the seq of its document/written (1 for a version a fork inherited)")
    schema_: str | None = Field(alias="schema", description="a json document's registered schema")
    schema_version: int | None


class DocumentsOut(Schema):
    session_id: str
    documents: list[DocumentOut]
    truncated: bool = Field(description="more documents than one answer lists (1,000)")


class DocumentContentOut(DocumentOut):
    encoding: Literal["utf-8", "base64"] = Field(description="utf-8 when the content is UTF-8 text, else base64")
    content: str


class ForkErrorOut(Schema):
    """`invalid_fork_point` (422): the nearest fork points, null where there is none yet."""

    code: str
    message: str
    before: int | None = None
    after: int | None = None


class UpgradeRefusedOut(Schema):
    """`upgrade_refused` (409): what the upgrade would strand; nothing changed."""

    code: str
    message: str
    reasons: list[str] = Field(default_factory=list)


class VersionOut(Schema):
    """The agent version a session runs under (before its first turn: the one it
    would open on) and its profile's newest."""

    number: int
    digest: str = Field(description="sha256 of the version's canonical snapshot")
    latest: int


class ProfileVersionOut(Schema):
    number: int
    digest: str
    created_at: str
    snapshot: dict[str, Any] = Field(
        description="everything a turn depends on: `profile` (the profile's fields but name, description, "
        "created_at and upgrade_policy) and `tools` (each built-in tool's name, parameters, approval, replay)"
    )
    sessions: int = Field(description="sessions on this version now")


class ProfileVersionsOut(Schema):
    versions: list[ProfileVersionOut]


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
        description="retries_exhausted (a resumed turn kept failing), context_overflow (compaction could not "
        "bring the request under the model's context window) or definition_missing (something the turn needs "
        "is gone from the running code or its definition: see `what`); null for a turn blocked before codes",
    )
    what: str | None = Field(
        None,
        description="with definition_missing, what is missing: tool:<name> (a tool a call is owed to, or a "
        "built-in the definition names), mcp_server:<name> (a server that fails to start), summarizer:<name>, "
        "or role:<role> (a model role nothing serves)",
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


class ChildrenSpentOut(Schema):
    cost_usd: float
    tokens: int


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
    children: ChildrenSpentOut = Field(
        description="what its subagents' child sessions spent, at any depth: counted against this session's cost "
        "and token budgets too"
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


class ToolInFlightOut(Schema):
    name: str = Field(description="the tool's name")
    since: str | None = Field(description="ISO 8601: when its attempt started (tool/attempt)")


class ProgressOut(Schema):
    """A running turn's progress: its last event, the text its model stream gave, its tool calls in flight."""

    last_event_at: str | None = Field(description="ISO 8601: the session's newest event")
    phase: Literal["model", "tool", "turn"] | None = Field(
        description="model: a step waits for its model's reply; tool: a tool call is in flight; turn: between "
        "steps; null: no turn is open"
    )
    streamed_tokens: int = Field(
        description="text chunks the current model call has streamed, as of its worker's last lease renewal "
        "(a third of TERRET_LEASE_SECONDS at most behind); 0 outside the model phase"
    )
    tools_in_flight: list[ToolInFlightOut]


class ParentOut(Schema):
    session_id: str
    task_id: str


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
    stalled_since: str | None = Field(
        description="ISO 8601: since when the running turn has made no progress, once it has made none for "
        "TERRET_STALL_SECONDS (its turn/stalled); null otherwise, and again once it makes progress"
    )
    title: str
    usage: UsageOut
    last_seq: int
    pending_approvals: list[PendingOut]
    budget: BudgetOut = Field(description="as GET …/budget answers")
    progress: ProgressOut = Field(description="what the open turn has done lately (docs/runtime.md, liveness)")
    version: VersionOut | None = Field(description="null: the session names no profile")
    parent: ParentOut | None = Field(None, description="a subagent's child session: the parent and its task")
    storage: StorageOut = Field(description="the log's size and storage tier (docs/storage.md)")


class StorageOut(Schema):
    events: int = Field(description="events in the log, hot and cold alike (its head seq)")
    bytes: int = Field(description="UTF-8 bytes of the events' payloads, hot and cold alike")
    tier: Literal["hot", "cold", "deleted"] = Field(
        description="hot: in the event table; cold: moved into a compressed archive, read back on the next touch; "
        "deleted: the profile's delete_cold_after_days removed the archived events"
    )
    stored_bytes: int | None = Field(None, description="cold only: the archive's compressed bytes")


class StorageIn(Schema):
    tier: Literal["hot", "cold"]


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
    max_runs: int | None = Field(description="a recurring schedule stops after this many runs (null: no limit)")
    expires_at: str | None = Field(description="a recurring schedule stops at this time (null: never)")
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


def effects_out(rows: list[Effect]) -> dict[str, Any]:
    """The ledger as EffectsOut; `pending` counts the attempts of unknown outcome."""
    return {"effects": [e.as_json() for e in rows], "pending": sum(1 for e in rows if e.state == "unknown")}


def resolved_out(resolved: Resolved) -> dict[str, Any]:
    return {"resolved": resolved.effect.as_json(), "status": resolved.status}


def profiles_out(profiles: list[ProfileRow]) -> dict[str, Any]:
    """The profiles a user may start sessions with, as ProfilesOut."""
    return {"profiles": [{"name": p.name, "description": p.description} for p in profiles]}


def created_out(session: SessionRow) -> dict[str, Any]:
    """A new session as CreatedOut."""
    return {
        "id": str(session.id),
        "profile": session.profile.name if session.profile else None,
        "status": session.status,
    }


def fork_out(child: SessionRow) -> dict[str, Any]:
    """A new fork as ForkOut (services.forks.as_json, the socket's shape too)."""
    return forks.as_json(child)


def schedule_out(made: ScheduleRow) -> dict[str, Any]:
    """A schedule as ScheduleOut (services.schedules.as_json: one shape for every door)."""
    return schedules.as_json(made)


def schedules_out(rows: list[ScheduleRow]) -> dict[str, Any]:
    return {"schedules": [schedule_out(s) for s in rows]}


class SchedulesOut(Schema):
    schedules: list[ScheduleOut]


class CoverageOut(Schema):
    source: str
    partition: str
    coverage: Literal["complete", "partial", "failed"] | None
    period: int | None
    pages: int
    items: int
    error: str
    at: str | None
    evidence: dict[str, Any]


class MonitorOut(Schema):
    id: str
    session_id: str
    status: Literal["active", "cancelled", "completed"]
    status_reason: str
    schedule: dict[str, Any] = Field(
        description="every_seconds or cron, misfire (skip, run_once, reschedule: as a schedule's), max_runs and "
        "expires_at (the profile's bounds when the request gave none; null: none)"
    )
    sources: list[dict[str, Any]]
    destination: dict[str, Any]
    quiet: Literal["suppress", "send"]
    digest: Literal["host", "model"]
    periods: int
    next_due_at: str | None
    idempotency_key: str | None
    created_by: str
    created_at: str
    coverage: list[CoverageOut] | None = None
    pending_items: int | None = None
    delivered_items: int | None = None
    secret: str | None = Field(None, description="the webhook signature's secret, in the creating answer only")


class MonitorsOut(Schema):
    monitors: list[MonitorOut]


class EditionOut(Schema):
    id: str
    monitor_id: str
    period: int
    destination: str
    status: Literal["prepared", "posting", "confirmed", "suppressed", "held", "unknown", "failed"]
    items: list[dict[str, Any]]
    scans: list[int]
    coverage: list[dict[str, Any]]
    digest: str
    digest_by: str = Field(description='"model", or "host" (and why, when the model was asked and failed)')
    receipt: str | None
    reason: str
    attempts: int
    created_at: str
    updated_at: str


class EditionsOut(Schema):
    editions: list[EditionOut]


def monitor_out(m: MonitorRow, *, secret: bool = False) -> dict[str, Any]:
    out = monitors.as_json(m)
    if secret:
        out["secret"] = m.secret
    return out


def edition_out(e: EditionRow) -> dict[str, Any]:
    return monitors.edition_json(e)


class TaskOwnerOut(Schema):
    session_id: str
    turn_seq: int


class TaskOut(Schema):
    """An owned task (docs/protocol.md, "Tasks"): actions.task_json is its one shape."""

    id: str
    kind: str = Field(description="command or subagent")
    version: int = Field(description="the kind's version the task runs under")
    phase: Literal["pending", "running", "waiting", "completing", "done", "failed", "cancelled", "blocked"]
    background: bool
    owner: TaskOwnerOut
    started_at: str
    age_s: float
    child_session: str | None = Field(None, description="a subagent's child session")
    ended_at: str | None = None
    outcome: dict[str, Any] | None = Field(
        None, description="a command's {exit_code, output}, a subagent's {answer}; with the terminal receipt"
    )
    reason: dict[str, Any] | None = Field(None, description="why it failed, was cancelled or is blocked: {code, ...}")
    argv: list[str] | None = None
    output: str | None = Field(None, description="a running command's output tail so far (bounded)")
    aborting: bool | None = Field(None, description="abort intent is committed; the cancelled receipt follows")


class TasksOut(Schema):
    tasks: list[TaskOut]


class EventOut(Schema):
    seq: int
    kind: str
    data: dict[str, Any]
    at: str


class EventsOut(Schema):
    events: list[EventOut]
    last_seq: int
    next_after: int | None = Field(
        None,
        description="where the next page starts (`after=`); null when this page reached last_seq. A page "
        "holds at most `limit` events and at most TERRET_READ_MAX_BYTES of payload (always at least one)",
    )


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
    result: str | None = Field(description="the content of its tool/result (a monitor send's tool/receipt), if any")
    resolution: dict[str, Any] | None = Field(description="its tool/resolved payload, once resolved")
    edition_id: str | None = Field(
        None,
        description="a host effect's: the monitor edition this attempt sends (tool monitor.publish, call "
        "edition-<id>); null for a tool call",
    )


class EffectsOut(Schema):
    effects: list[EffectOut] = Field(description="every attempt of the session, oldest first")
    pending: int = Field(description="how many are in state unknown (waiting for an operator)")


class ResolveOut(Schema):
    resolved: EffectOut = Field(description="the attempt that was resolved, as it was before the resolution")
    status: Status = Field(description="the session's status once the resolution was recorded")


class AttentionItemOut(Schema):
    kind: str = Field(
        description="blocked, suspended, revoked, held_input, approval, expired_lease, unknown_effects, "
        "effects_audit, stalled, notification, stranded, monitor_coverage, monitor_unknown, monitor_held"
    )
    session_id: str | None = Field(description="null for a profile's or the global suspension")
    title: str
    since: str | None = Field(description="ISO 8601")
    age_seconds: float | None
    detail: dict[str, Any]


class AttentionOut(Schema):
    attention: dict[str, list[AttentionItemOut]] = Field(
        description="by kind (blocked, suspended, revoked, held_input, approvals oldest first, expired_leases, "
        "unknown_effects: every turn's unresolved attempts, open or ended, detail {pending, open_turn, calls}, "
        "effects_audit: what the sweep's effect audit found, detail {problems, found, audited_seq}, "
        "stalled: running turns with no progress for TERRET_STALL_SECONDS, their detail the turn's progress, "
        "stranded: sessions a deploy left behind, detail {code: definition_missing | unsupported_version | "
        'pinned_version, what, reason; waiting: "input" for idle input no live worker can read}), '
        "monitors: failed or partial coverage, unknown and held editions, detail {monitor_id, edition_id, reason}; "
        "tasks_live, tasks_blocked, tasks_orphaned: owned tasks, detail {task} (a TaskOut), "
        "each at most 200"
    )
    counts: dict[str, int]


class OpsOut(Schema):
    ok: bool
    woken: int | None = Field(None, description="resume only: how many held sessions were woken")


class SessionActionOut(Schema):
    ok: bool
    status: Status = Field(description="the session's status once the action was recorded")


class NotificationsOut(Schema):
    email: bool = Field(description="whether notifications come by email (when the server sends email)")
    webhook_url: str | None
    webhook_secret: str | None = Field(description="never the secret: its last four characters, masked; null if none")
