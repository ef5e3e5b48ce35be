"""The event-kind catalogue: every kind the log accepts, its payload schema,
whether the model sees it, and which projection columns its append updates.

`docs/events.md` describes the same catalogue for people; a test checks the
two name the same kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import jsonschema_rs

from sessions_app.errors import InvalidPayload, UnknownEventKind

Json = dict[str, Any]
# A projection update: (SQL assignment, params). "NEW_SEQ" in the SQL is
# replaced by the expression for the seq being appended.
Assignment = tuple[str, list[Any]]

_STR = {"type": "string"}
_NONEMPTY = {"type": "string", "minLength": 1}
_SEQ = {"type": "integer", "minimum": 1}
_USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        # null: the provider gave no price; counted as unpriced, never as $0.
        "cost": {"type": ["number", "null"], "minimum": 0},
    },
    "required": ["prompt_tokens", "completion_tokens"],
    "additionalProperties": False,
}
_TOOL_CALL = {
    "type": "object",
    "properties": {"id": _NONEMPTY, "name": _NONEMPTY, "arguments": _STR},
    "required": ["id", "name", "arguments"],
    "additionalProperties": False,
}
TURN_STATUSES = ("completed", "cancelled", "rejected", "empty", "failed")
MODEL_ROLES = ("main", "titler", "compactor")
# A turn's health columns start over with every turn/start and turn/end.
_TURN_FRESH: list[tuple[str, list[Any]]] = [
    ("blocked_seq = NULL", []),
    ("cancel_seq = NULL", []),
    ("unknown_effects = 0", []),
    ("stalled_seq = NULL", []),
    ("waiting_tasks = 0", []),
]
# Where a turn that made no progress stood (turn/stalled's `phase`).
STALL_PHASES = ("model", "tool", "turn")
REPLAY_POLICIES = ("safe", "reconcile", "never")
RESOLUTIONS = ("rerun", "done", "failed")
_ATTEMPT = {"type": "integer", "minimum": 1}
# A tool result's images (runtime/storable.py bounds their number and size).
_ATTACHMENTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"type": {"enum": ["image"]}, "mime_type": _NONEMPTY, "data": _STR},
        "required": ["type", "mime_type", "data"],
        "additionalProperties": False,
    },
}
_TRACEPARENT = {"type": "string", "pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"}


def _obj(props: Json, required: list[str] | None = None) -> Json:
    return {"type": "object", "properties": props, "required": required or [], "additionalProperties": False}


_VERSION = _obj({"number": _SEQ, "digest": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}, ["number", "digest"])
# session/upgraded's `from` and `to`: digest null only in an event lifted from version 1, which had none.
_VERSION_REF = _obj(
    {"number": _SEQ, "digest": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"}}, ["number", "digest"]
)


_BUDGET_REASON = _obj(
    {
        "budget": {"enum": ["cost_usd", "tokens", "steps", "turns"]},
        "scope": {"enum": ["session", "profile", "global"]},
        "limit": {"type": "number", "minimum": 0},
        "spent": {"type": "number", "minimum": 0},
        "unpriced": {"type": "integer", "minimum": 0},
    },
    ["budget", "scope", "limit", "spent"],
)
# Why input is held: a budget, or an operator's suspension.
_HOLD_REASON = {
    "anyOf": [
        _BUDGET_REASON,
        _obj(
            {"hold": {"enum": ["suspended"]}, "scope": {"enum": ["session", "profile", "global"]}, "by": _STR},
            ["hold", "scope"],
        ),
    ]
}
_OPERATOR = _obj({"by": _NONEMPTY, "reason": _STR}, ["by"])
ON_EXPIRY = ("deny", "park")
_SECS = {"type": "number", "minimum": 0}
# The clock a request for approval runs on (approvals_app/deadlines.py).
_DEADLINE = _obj(
    {
        "deadline_s": {"type": ["integer", "null"], "minimum": 1},
        "remind_every_s": {"type": ["integer", "null"], "minimum": 1},
        "escalate_to": {"type": ["string", "null"]},
        "on_expiry": {"enum": list(ON_EXPIRY)},
    },
    ["deadline_s", "on_expiry"],
)
# What a reviewer's verdict rested on (sessions_app/permissions.py grounds_of).
_GROUNDS = _obj(
    {
        "as": {"enum": ["staff", "reviewers", "permission"]},
        "group": _NONEMPTY,
        "user_id": {"type": "integer"},
        "policy_seq": {"type": ["integer", "null"], "minimum": 1},
    },
    ["as", "user_id", "policy_seq"],
)


@dataclass(frozen=True)
class Kind:
    name: str
    schema: Json
    model_visible: bool
    doc: str
    project: Callable[[Json], list[Assignment]] | None = None
    # Extra writes in the append's own statement/transaction (see log/backends):
    # each SQL reads the appended row's session as `s` (s.profile_id, s.day, and
    # s.shard: which of its profile's day tally rows it adds to, runs.tally_shard).
    extra: Callable[[Json], list[Assignment]] | None = None
    # The payload's schema version: a change to `schema` that an older
    # payload no longer meets bumps it, with an upcaster per step
    # (log/upcasters.py). Events store the version they were written with.
    version: int = 1
    validator: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "validator", jsonschema_rs.validator_for(self.schema))


LANES = ("steer", "follow_up", "passive")
# The lanes that wait for a turn boundary (input/deferred), against the steer
# lane's input/queued, which rides the running turn.
DEFERRED_LANES = ("follow_up", "passive")


def _inbox(data: Json) -> list[Assignment]:
    """A placement: queued input taken into the transcript. Each lane has its
    own cursor (see runtime/admission.py for why both only move forwards)."""
    src = data.get("source_seq")
    if src is None:
        return []
    # Held input is held no more once a turn takes in what was held.
    unhold = ("held_seq = CASE WHEN held_seq <= %s THEN NULL ELSE held_seq END", [src])
    lane = data.get("lane")
    if lane in DEFERRED_LANES:
        out = [("deferred_cursor = CASE WHEN deferred_cursor < %s THEN %s ELSE deferred_cursor END", [src, src])]
        if lane == "follow_up":
            out.append(("queued_follow_ups = queued_follow_ups - 1", []))
        return [*out, unhold]
    return [("inbox_seq = CASE WHEN inbox_seq < %s THEN %s ELSE inbox_seq END", [src, src]), unhold, _woken_up_to(src)]


def _woken_up_to(seq: int) -> Assignment:
    """The steer lane's cursor reaches `seq`: once that is its newest input,
    no woken steer waits any more (Session.woken_steers)."""
    return ("woken_steers = CASE WHEN %s >= last_input_seq THEN 0 ELSE woken_steers END", [seq])


def _withdrawn(data: Json) -> list[Assignment]:
    """A withdrawal moves a lane's cursor only as far as the service found,
    under the row lock, that nothing before it is still waiting."""
    out: list[Assignment] = []
    if "inbox_to" in data:
        to = data["inbox_to"]
        out.append(("inbox_seq = CASE WHEN inbox_seq < %s THEN %s ELSE inbox_seq END", [to, to]))
        out.append(_woken_up_to(to))
    if "deferred_to" in data:
        to = data["deferred_to"]
        out.append(("deferred_cursor = CASE WHEN deferred_cursor < %s THEN %s ELSE deferred_cursor END", [to, to]))
    if data["lane"] == "follow_up":
        out.append(("queued_follow_ups = queued_follow_ups - 1", []))
    if data.get("unhold"):
        out.append(("held_seq = NULL", []))
    return out


def _deferred(data: Json) -> list[Assignment]:
    out: list[Assignment] = [("deferred_seq = NEW_SEQ", [])]
    if data["lane"] == "follow_up":
        out += [("queued_follow_ups = queued_follow_ups + 1", []), ("blocked_seq = NULL", [])]
    return out


def _usage_totals(usage: Json | None, *, step: bool, elsewhere: bool = False) -> list[Assignment]:
    """`elsewhere`: a step/end whose request's spend a usage/recorded counted
    already (its figure, or its "unknown"): the step counts, its usage not."""
    out: list[Assignment] = [("steps = steps + 1", [])] if step else []
    if elsewhere and usage is None:
        return out
    if usage is None:
        return [*out, ("unpriced_entries = unpriced_entries + 1", [])]
    out.append(("prompt_tokens = prompt_tokens + %s", [int(usage["prompt_tokens"])]))
    out.append(("completion_tokens = completion_tokens + %s", [int(usage["completion_tokens"])]))
    cost = usage.get("cost")
    if cost is None:
        out.append(("unpriced_entries = unpriced_entries + 1", []))
    else:
        out.append(("cost = cost + %s", [Decimal(str(cost))]))
    return out


class Tally(str):
    """An extra write that adds to one row of a per-profile, per-UTC-day tally
    table (the row of `s`'s day, profile and shard, and of `keys`), creating
    it at the first. The string is the upsert, which both backends can run
    (params: one per column, in order). `update` and `insert_unless` are
    PostgreSQL's form (log/backends/postgres.py): an UPDATE first, and the
    upsert only when it found no row. An upsert that finds its row locks it
    before it updates it, one more WAL record; a tally row exists after the
    first step of a shard's day, so the UPDATE is what runs."""

    table: str
    columns: tuple[str, ...]
    keys: tuple[str, ...]
    adds: tuple[str, ...]

    def __new__(cls, table: str, columns: tuple[str, ...], keys: tuple[str, ...], adds: tuple[str, ...]) -> Tally:
        conflict = ", ".join(("day", "profile_id", *keys, "shard"))
        sets = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in adds)
        text = (
            f"INSERT INTO {table} (day, profile_id, shard, {', '.join(columns)}) "
            f"SELECT s.day, s.profile_id, s.shard, {', '.join(['%s'] * len(columns))} FROM s WHERE true "
            f"ON CONFLICT ({conflict}) DO UPDATE SET {sets}"
        )
        tally = super().__new__(cls, text)
        tally.table, tally.columns, tally.keys, tally.adds = table, columns, keys, adds
        return tally

    @property
    def update(self) -> str:
        """The UPDATE of the existing row, RETURNING 1 if there was one; the same params as the upsert."""
        sets = ", ".join(f"{c} = t.{c} + v.{c}" for c in self.adds)
        match = [*(f"t.{k} = s.{k}" for k in ("day", "profile_id", "shard")), *(f"t.{k} = v.{k}" for k in self.keys)]
        values = ", ".join(["%s"] * len(self.columns))
        return (
            f"UPDATE {self.table} AS t SET {sets} FROM s, (SELECT {values}) AS v({', '.join(self.columns)}) "
            f"WHERE {' AND '.join(match)} RETURNING 1"
        )

    def insert_unless(self, updated: str) -> str:
        """The upsert, writing nothing when the CTE `updated` (its update) returned a row."""
        return self.replace("FROM s WHERE true", f"FROM s WHERE NOT EXISTS (SELECT 1 FROM {updated})", 1)


_USAGE_COLUMNS = ("steps", "unpriced_entries", "prompt_tokens", "completion_tokens", "cost")
_USAGE_DAY_UPSERT = Tally("sessions_app_usageday", _USAGE_COLUMNS, (), _USAGE_COLUMNS)
_TURNS_DAY_UPSERT = Tally("sessions_app_usageday", (*_USAGE_COLUMNS, "turns"), (), ("turns",))
# Turns ended by status and budget reason, and model requests by model, per
# profile per UTC day (TurnTally, ModelTally: read by /metrics).
_TURN_TALLY_UPSERT = Tally("sessions_app_turntally", ("status", "reason", "count"), ("status", "reason"), ("count",))
_MODEL_SPEND_ADDS = ("requests", "prompt_tokens", "completion_tokens", "cost", "latency_ms", "timed")
_MODEL_SPEND_UPSERT = Tally("sessions_app_modeltally", ("model", *_MODEL_SPEND_ADDS), ("model",), _MODEL_SPEND_ADDS)


def _model_spend(data: Json) -> list[Assignment]:
    """What a step/end or usage/recorded says its model spent (and how long
    the step's request took), per model: /metrics' by-model figures."""
    model, usage = data.get("model"), data.get("usage")
    latency = data.get("latency_ms")
    if not model or (usage is None and latency is None):
        return []
    prompt = int(usage["prompt_tokens"]) if usage else 0
    completion = int(usage["completion_tokens"]) if usage else 0
    cost = Decimal(str(usage["cost"])) if usage and usage.get("cost") is not None else Decimal(0)
    timed = 0 if latency is None else 1  # a step's own request: counted, and timed
    return [(_MODEL_SPEND_UPSERT, [model, timed, prompt, completion, cost, int(latency or 0), timed])]


def _turn_tally(data: Json) -> list[Assignment]:
    reason = data.get("reason")
    budget = reason.get("budget", "") if isinstance(reason, dict) else ""
    return [(_TURN_TALLY_UPSERT, [data["status"], budget, 1])]


_LIMIT = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}
BUDGETS = ("cost_usd", "tokens", "steps", "turns")

_MODEL_WINDOW_UPSERT = (
    "INSERT INTO sessions_app_modelwindow (spec, tokens) SELECT %s, %s FROM s WHERE true "
    "ON CONFLICT (spec) DO UPDATE SET tokens = excluded.tokens"
)


def _usage_day(usage: Json | None, *, step: bool, elsewhere: bool = False) -> list[Assignment]:
    """The per-profile per-UTC-day running total (UsageDay), same figures as _usage_totals."""
    unpriced = (usage is None and not elsewhere) or (usage is not None and usage.get("cost") is None)
    prompt = int(usage["prompt_tokens"]) if usage else 0
    completion = int(usage["completion_tokens"]) if usage else 0
    cost = Decimal(0) if unpriced or usage is None else Decimal(str(usage["cost"]))
    return [(_USAGE_DAY_UPSERT, [int(step), int(unpriced), prompt, completion, cost])]


CATALOGUE: dict[str, Kind] = {
    k.name: k
    for k in [
        # --- model-visible --------------------------------------------------
        Kind(
            "user/message",
            _obj({"text": _STR, "source_seq": _SEQ, "lane": {"enum": list(DEFERRED_LANES)}}, ["text"]),
            True,
            "A user's input that opened a turn. `source_seq` names the input/queued it came from.",
            _inbox,
        ),
        Kind(
            "context/injected",
            _obj({"text": _STR, "source_seq": _SEQ, "lane": {"enum": list(DEFERRED_LANES)}}, ["text"]),
            True,
            "Queued input (a steer, or a woken inbox item) riding into a step.",
            _inbox,
        ),
        Kind(
            "assistant/message",
            _obj(
                {
                    "content": {"type": ["string", "null"]},
                    "tool_calls": {"type": "array", "items": _TOOL_CALL},
                    "usage": _USAGE,
                    "partial": {"type": "boolean"},
                }
            ),
            True,
            "The model's complete reply for one step: text and/or tool calls. `usage` is kept here too so a "
            "step closed later (after an approval or a crash) still carries its figure on step/end. `partial` "
            "marks the text streamed before a Stop cut the reply short.",
        ),
        Kind(
            "tool/result",
            _obj(
                {
                    "call_id": _NONEMPTY,
                    "name": _NONEMPTY,
                    "content": _STR,
                    "is_error": {"type": "boolean"},
                    "attempt": _ATTEMPT,
                    "via": {"enum": ["reconcile", "operator", "closing"]},
                    "attachments": _ATTACHMENTS,
                },
                ["call_id", "name", "content"],
            ),
            True,
            "The outcome of one tool call; vetoes, denials and tool errors have is_error true. `attempt` names "
            "the tool/attempt it closes (absent: the call never ran, or ran inline). `via` says where an outcome "
            "came from when the tool's own run did not give it: its target's answer to a reconcile, an "
            "operator's resolution, or the closing of a cancelled or failed turn. `attachments` holds the images "
            "a tool returned (each named in `content` too), passed to models that take images.",
        ),
        Kind(
            "session/compacted",
            _obj(
                {"upto_seq": {"type": "integer", "minimum": 0}, "summary": _STR, "turn_seq": _SEQ},
                ["upto_seq", "summary"],
            ),
            True,
            "Every event at or before upto_seq is replaced by summary in the model's view. `turn_seq` marks a "
            "compaction inside the open turn that began there, at a step boundary (docs/compaction.md).",
            lambda d: [("compacted_seq = NEW_SEQ", [])],
        ),
        # --- metadata -------------------------------------------------------
        Kind(
            "turn/start",
            _obj({"by": _STR, "traceparent": _TRACEPARENT, "regenerate": {"type": "boolean"}, "version": _VERSION}),
            False,
            "A turn opens. At most one turn is open at a time. `traceparent` (W3C, written while tracing is on) "
            "names the turn's root span, so every drive of the turn, on any worker, joins one trace. "
            "`regenerate`: the turn takes in no input and asks the model again for the reply to the history "
            "as it stands (a fork's regenerate). `version`: the agent version (number and digest) the turn "
            "runs under to its end (absent: a session with no profile, or a turn from before versions).",
            lambda d: [
                ("open_turn_seq = NEW_SEQ", []),
                ("turns = turns + 1", []),
                *_TURN_FRESH,
                *([("agent_version = %s", [d["version"]["number"]])] if "version" in d else []),
            ],
            lambda d: [(_TURNS_DAY_UPSERT, [0, 0, 0, 0, Decimal(0), 1])],
        ),
        Kind(
            "turn/end",
            _obj(
                {"status": {"enum": list(TURN_STATUSES)}, "error": _STR, "by": _STR, "reason": _BUDGET_REASON},
                ["status"],
            ),
            False,
            "The open turn closes with one of five statuses; `error` says why a turn failed (a provider's own "
            "message included, cut short and without secrets). `by` names who closed a turn no worker held. "
            "`reason` is structured when a budget ended it: which budget, at what scope, its limit and the spend.",
            lambda d: [("open_turn_seq = NULL", []), ("pending_approvals = 0", []), *_TURN_FRESH],
            _turn_tally,
        ),
        Kind(
            "turn/cancel_requested",
            _obj({"by": _STR, "reason": _STR}),
            False,
            "A cancel was accepted; a worker driving the turn stops its model stream within about a second "
            "and ends the turn cancelled.",
            lambda d: [("cancel_seq = NEW_SEQ", []), ("blocked_seq = NULL", [])],
        ),
        Kind(
            "turn/stalled",
            {
                **_obj(
                    {
                        "attempt": {"type": "integer", "minimum": 1},
                        "error": _STR,
                        "retry_in": {"type": "number"},
                        "since": _NONEMPTY,
                        "phase": {"enum": list(STALL_PHASES)},
                    }
                ),
                # One shape or the other, never a mix.
                "oneOf": [{"required": ["attempt", "error", "retry_in"]}, {"required": ["since", "phase"]}],
            },
            False,
            "Two shapes. `{attempt, error, retry_in}`: a resumed turn failed transiently; it is retried after "
            "`retry_in` seconds (attempt N of the setting TERRET_RESUME_ATTEMPTS). `{since, phase}`: the running "
            "turn has made no progress (no event, no streamed text) since `since` (ISO 8601), for "
            "TERRET_STALL_SECONDS; `phase` is where it stands (model, tool, turn). Appended once by a worker's "
            "sweep; it stands until anything happens after it.",
            lambda d: [("stalled_seq = NEW_SEQ", [])] if "since" in d else [],
        ),
        Kind(
            "turn/blocked",
            _obj(
                {
                    "reason": _STR,
                    "attempts": {"type": "integer", "minimum": 0},
                    "code": {
                        "enum": ["retries_exhausted", "context_overflow", "definition_missing", "unsupported_version"]
                    },
                    "what": {"type": "string", "maxLength": 200},
                },
                ["reason", "attempts"],
            ),
            False,
            "The open turn stopped retrying by itself: `code` retries_exhausted (a resumed turn failed "
            "TERRET_RESUME_ATTEMPTS times), context_overflow (compaction could not bring its request under "
            "the model's context window) or definition_missing (something the turn needs is gone from the "
            "running code or its definition; `what` names it: tool:<name>, mcp_server:<name>, "
            "summarizer:<name> or role:<role>), or unsupported_version (the log holds an event version no "
            "live worker reads; `what` is event:<kind>@<version>). New input, a verdict, a cancel or a retry "
            "(turn/retry_requested) picks it up again.",
            lambda d: [("blocked_seq = NEW_SEQ", [])],
        ),
        Kind(
            "turn/retry_requested",
            _obj({"by": _STR, "reason": _STR}),
            False,
            "Someone asked a blocked turn to be driven again.",
            lambda d: [("blocked_seq = NULL", [])],
        ),
        Kind(
            "step/start",
            _obj({"step": {"type": "integer", "minimum": 1}, "model": _NONEMPTY}, ["step", "model"]),
            False,
            "A step begins; `model` is the main role's resolved spec.",
        ),
        Kind(
            "step/end",
            _obj(
                {
                    "step": {"type": "integer", "minimum": 1},
                    "usage": _USAGE,
                    "usage_recorded": {"type": "boolean"},
                    "model": _STR,
                    "latency_ms": {"type": "integer", "minimum": 0},
                },
                ["step"],
            ),
            False,
            "A step ends, with the usage of its model request, its model and how long the request took. No "
            "usage: its figure is lost (unpriced), unless `usage_recorded` says a usage/recorded of the step "
            "counted the request already.",
            lambda d: _usage_totals(d.get("usage"), step=True, elsewhere=bool(d.get("usage_recorded"))),
            lambda d: [
                *_usage_day(d.get("usage"), step=True, elsewhere=bool(d.get("usage_recorded"))),
                *_model_spend(d),
            ],
        ),
        Kind(
            "usage/recorded",
            _obj(
                {
                    "purpose": {"enum": ["title", "compaction", "step", "digest"]},
                    "model": _STR,
                    "usage": {"anyOf": [_USAGE, {"type": "null"}]},
                    "step": {"type": "integer", "minimum": 1},
                    "reason": _STR,
                },
                ["purpose", "usage"],
            ),
            False,
            "Usage of a request whose figure no step/end carries: a utility request (titler, summarizer, a "
            "monitor's digest), or a "
            "step's model request whose reply never committed (a lost lease, a torn stream, a crash: `usage` "
            "null means unknown, counted as unpriced). Appended without a fence: spend is recorded whoever "
            "holds the session now.",
            lambda d: _usage_totals(d["usage"], step=False),
            lambda d: [*_usage_day(d["usage"], step=False), *_model_spend(d)],
        ),
        Kind(
            "input/queued",
            _obj(
                {"text": _STR, "wake": {"type": "boolean"}, "idempotency_key": _STR, "by": _STR},
                ["text", "wake"],
            ),
            False,
            "Durably queued input; it rides the next step as context/injected (or opens the next turn).",
            lambda d: [
                ("last_input_seq = NEW_SEQ", []),
                ("blocked_seq = NULL", []),
                *([("woken_steers = woken_steers + 1", [])] if d["wake"] else []),
            ],
        ),
        Kind(
            "input/deferred",
            _obj(
                {
                    "text": _STR,
                    "lane": {"enum": list(DEFERRED_LANES)},
                    "idempotency_key": _STR,
                    "by": _STR,
                    "schedule_id": _NONEMPTY,
                    "task_id": _NONEMPTY,
                },
                ["text", "lane"],
            ),
            False,
            "Input in a lane that waits for a turn boundary: a follow_up opens a turn of its own once the "
            "running one ends (one follow-up per turn, in arrival order); a passive write starts nothing and is "
            "taken in, as context, by the next turn that opens. Placed by a user/message or context/injected "
            "with `source_seq` and `lane`.",
            _deferred,
        ),
        Kind(
            "input/withdrawn",
            _obj(
                {
                    "source_seq": _SEQ,
                    "lane": {"enum": list(LANES)},
                    "by": _STR,
                    "inbox_to": {"type": "integer", "minimum": 0},
                    "deferred_to": {"type": "integer", "minimum": 0},
                    "unhold": {"type": "boolean"},
                },
                ["source_seq", "lane"],
            ),
            False,
            "Its owner took back queued input (source_seq) before any turn took it in. `inbox_to` / "
            "`deferred_to` move a lane's cursor past it when nothing before it still waits; `unhold` clears the "
            "held marker when it was the held input.",
            _withdrawn,
        ),
        Kind(
            "schedule/created",
            _obj(
                {
                    "schedule_id": _NONEMPTY,
                    "by": _STR,
                    "due_at": {"type": ["string", "null"]},
                    "every_seconds": {"type": ["integer", "null"]},
                    "cron": _STR,
                    "misfire": {"enum": ["skip", "run_once", "reschedule"]},
                    "max_runs": {"type": ["integer", "null"]},
                    "expires_at": {"type": ["string", "null"]},
                    "reason": _STR,
                },
                ["schedule_id", "misfire"],
            ),
            False,
            "A wake-up was scheduled for this session, by a person or by the agent's schedule.create tool. A "
            "recurring one is bounded by default: max_runs and expires_at are the profile's when the request "
            "gave none.",
        ),
        Kind(
            "schedule/fired",
            _obj(
                {
                    "schedule_id": _NONEMPTY,
                    "due_at": _NONEMPTY,
                    "late_ms": {"type": "integer", "minimum": 0},
                    "run": {"type": "integer", "minimum": 1},
                    "input_seq": _SEQ,
                    "missed": {"type": "integer", "minimum": 0},
                    "worker": _STR,
                },
                ["schedule_id", "due_at", "late_ms", "run", "input_seq"],
            ),
            False,
            "A schedule came due and delivered its input (input_seq, an input/deferred follow-up). `missed` "
            "counts due times a misfire policy folded into this one.",
        ),
        Kind(
            "schedule/cancelled",
            _obj({"schedule_id": _NONEMPTY, "by": _STR, "reason": _STR}, ["schedule_id"]),
            False,
            "A schedule was cancelled: by a person, by the agent, or by the clock because the session was revoked "
            "or archived, or its owner's account is inactive (reason `owner_inactive`).",
        ),
        Kind(
            "schedule/paused",
            _obj(
                {"schedule_id": _NONEMPTY, "reason": _NONEMPTY, "runs": {"type": "integer"}}, ["schedule_id", "reason"]
            ),
            False,
            "A schedule paused itself: its last runs made no progress (turns that ended empty, failed or rejected).",
        ),
        Kind(
            "monitor/edition",
            _obj(
                {
                    "monitor_id": _NONEMPTY,
                    "edition_id": _NONEMPTY,
                    "period": {"type": "integer", "minimum": 1},
                    "digest": _STR,
                    "items": {"type": "array", "maxItems": 500, "items": {"type": "object"}},
                },
                ["monitor_id", "edition_id", "period", "digest", "items"],
            ),
            False,
            "A monitor's edition delivered to the session itself (destination `session`): the digest and the "
            "item versions it selected. Its seq is the edition's receipt, written in the same transaction as "
            "the edition's confirmation, so it is there exactly once. Not model-visible: it can land while a "
            "turn is open, between a step's tool calls and their results.",
        ),
        Kind(
            "session/upgraded",
            _obj(
                {"from": {"oneOf": [_VERSION_REF, {"type": "null"}]}, "to": _VERSION_REF, "by": _NONEMPTY},
                ["from", "to", "by"],
            ),
            False,
            "The session moves from agent version `from` to `to`, each `{number, digest}` as turn/start's "
            "`version` names it (`from` null: the session had none): at a turn's opening by the profile's "
            'upgrade_policy (`by` "policy"), or by an owner or operator (`by` names them; an open turn, '
            "parked or blocked, goes on under `to` after the pre-flight found nothing it would strand). "
            "Version 1 held the bare numbers; read lifted, its digests are null (log/upcasters.py).",
            lambda d: [("agent_version = %s", [d["to"]["number"]])],
            version=2,
        ),
        Kind(
            "session/suspended",
            _OPERATOR,
            False,
            "An operator suspended the session's admission: input is held, nothing starts, and a running turn "
            "parks at its next step boundary (status suspended) until session/resumed.",
            lambda d: [("suspended_seq = NEW_SEQ", [])],
        ),
        Kind(
            "session/resumed",
            _OPERATOR,
            False,
            "The session's suspension ends: held input and a parked turn run again.",
            lambda d: [("suspended_seq = NULL", [])],
        ),
        Kind(
            "session/revoked",
            _OPERATOR,
            False,
            "An operator revoked the session: its turn is cancelled, every tool call is denied and new input is "
            "refused, until session/restored.",
            lambda d: [("revoked_seq = NEW_SEQ", [])],
        ),
        Kind(
            "session/restored",
            _OPERATOR,
            False,
            "A staff member restored a revoked session.",
            lambda d: [("revoked_seq = NULL", [])],
        ),
        Kind(
            "tool/attempt",
            _obj(
                {
                    "call_id": _NONEMPTY,
                    "name": _NONEMPTY,
                    "attempt": _ATTEMPT,
                    "idempotency_key": _NONEMPTY,
                    "replay": {"enum": list(REPLAY_POLICIES)},
                    "fence": {"type": "integer", "minimum": 0},
                    "step": {"type": "integer", "minimum": 1},
                    "worker": _STR,
                    "replaces": _ATTEMPT,
                    "why": {"enum": ["safe", "not_done", "rerun"]},
                    # Present when a reviewer edited the call's arguments: the JSON that ran.
                    "arguments": _STR,
                    "edited": {"type": "boolean"},
                    # A host effect no model call made: a monitor's send of this edition (sessions_app/monitors/).
                    "edition_id": _NONEMPTY,
                    "monitor_id": _NONEMPTY,
                },
                ["call_id", "name", "attempt", "idempotency_key", "replay", "fence"],
            ),
            False,
            "The intent, committed before a tool that is not inline runs: which attempt of the call, the key "
            "that stays the same for every attempt of it, the replay policy it was admitted under, and the lease "
            "generation and worker that run it. Reentry with no outcome after it means the effect may have "
            "happened. A re-run names the attempt it `replaces` and `why`: the tool is safe to replay, its "
            "target said the effect is not done, or an operator asked for a rerun. With `edition_id` and "
            "`monitor_id` it is a monitor's send of an edition (name `monitor.publish`, call id "
            "`edition-<edition id>`, the edition id its idempotency key, `fence` 0), committed with the edition's "
            "`posting`; its outcome is a tool/receipt, not a tool/result.",
        ),
        Kind(
            "tool/receipt",
            _obj(
                {
                    "call_id": _NONEMPTY,
                    "name": _NONEMPTY,
                    "attempt": _ATTEMPT,
                    "content": _STR,
                    "is_error": {"type": "boolean"},
                    "receipt": _NONEMPTY,
                    "edition_id": _NONEMPTY,
                },
                ["call_id", "name", "attempt", "content", "edition_id"],
            ),
            False,
            "The outcome of a host effect's attempt (a monitor's send of an edition), in the effect ledger "
            "where a tool call's tool/result would be: `receipt` the identity the destination confirmed (the "
            "webhook's id, the accepted Message-ID), or `is_error` true and `content` why it certainly was not "
            "taken. Committed with the edition's confirmation (and its delivered entries) or failure. Not "
            "model-visible: no model call made it, so it must not reach the model's context as a tool message.",
        ),
        Kind(
            "tool/unknown",
            _obj(
                {"call_id": _NONEMPTY, "name": _NONEMPTY, "attempt": _ATTEMPT, "reason": _STR, "edition_id": _NONEMPTY},
                ["call_id", "name", "attempt"],
            ),
            False,
            "An attempt whose outcome nobody knows (its worker died before the result, and the tool may not be "
            "re-run blindly); the turn waits for an operator (status waiting_reconcile). It stays on /ops/ and "
            "in /metrics until resolved, after its turn ends too (Session.unresolved_effects). With `edition_id`: "
            "a monitor's send of unknown outcome (the destination took the request and no answer came back, or "
            "its worker died mid-send); it holds that monitor's later sends, not the session's turns "
            "(unresolved_effects only).",
            lambda d: [
                *([] if "edition_id" in d else [("unknown_effects = unknown_effects + 1", [])]),
                ("unresolved_effects = unresolved_effects + 1", []),
            ],
        ),
        Kind(
            "tool/resolved",
            _obj(
                {
                    "call_id": _NONEMPTY,
                    "attempt": _ATTEMPT,
                    "action": {"enum": list(RESOLUTIONS)},
                    "result": _STR,
                    "reason": _STR,
                    "by": _NONEMPTY,
                    "edition_id": _NONEMPTY,
                },
                ["call_id", "attempt", "action", "by"],
            ),
            False,
            "An operator's answer to an unknown attempt: run it again (a new attempt, same key), or record it "
            "done (with the result the model sees) or failed. With `edition_id`, the answer about a monitor's "
            "send: rerun sends the edition again under the same Idempotency-Key, done (`result` the "
            "destination's receipt) confirms it, failed gives its items back to the next edition; `by` "
            '"terret" when the host itself re-sends to a destination that honours the key.',
            lambda d: [
                *(
                    []
                    if "edition_id" in d
                    else [("unknown_effects = CASE WHEN unknown_effects > 0 THEN unknown_effects - 1 ELSE 0 END", [])]
                ),
                ("unresolved_effects = CASE WHEN unresolved_effects > 0 THEN unresolved_effects - 1 ELSE 0 END", []),
            ],
        ),
        Kind(
            "budget/updated",
            _obj(
                {
                    "cost_usd": {"anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}]},
                    "tokens": _LIMIT,
                    "steps": _LIMIT,
                    "turns": _LIMIT,
                    "by": _STR,
                },
                ["cost_usd", "tokens", "steps", "turns"],
            ),
            False,
            "The session's budget from now on, each limit over the session's whole life (null: none). Spent is "
            "the usage totals: cost in USD, prompt plus completion tokens, model steps, turns.",
            lambda d: [
                ("budget_cost_usd = %s", [None if d["cost_usd"] is None else Decimal(str(d["cost_usd"]))]),
                ("budget_tokens = %s", [d["tokens"]]),
                ("budget_steps = %s", [d["steps"]]),
                ("budget_turns = %s", [d["turns"]]),
            ],
        ),
        Kind(
            "input/held",
            _obj({"source_seq": _SEQ, "reason": _HOLD_REASON, "text": _STR}, ["source_seq", "reason"]),
            False,
            "Queued input (source_seq) is held: a budget is exhausted, or an operator suspended admission, so no "
            "turn starts for it. It runs once that allows (a raised budget, a new UTC day for a daily one, a "
            "resume): the sweep offers it again.",
            lambda d: [("held_seq = CASE WHEN held_seq IS NULL THEN %s ELSE held_seq END", [d["source_seq"]])],
        ),
        Kind(
            "approval/requested",
            _obj(
                {"call_id": _NONEMPTY, "name": _NONEMPTY, "args": {"type": "object"}, "deadline": _DEADLINE},
                ["call_id", "name", "args"],
            ),
            False,
            "A tool call is parked until a human decides. `deadline` (opt-in, from the profile or the tool's "
            "approval settings) is the clock the request runs on.",
            lambda d: [("pending_approvals = pending_approvals + 1", [])],
        ),
        Kind(
            "approval/resolved",
            _obj(
                {
                    "call_id": _NONEMPTY,
                    "verdict": {"enum": ["approve", "deny"]},
                    "reason": _STR,
                    "by": _STR,
                    # approve only: the arguments that run instead of the model's.
                    "edited_args": {"type": "object"},
                    # A reviewer's verdict: what their authority rested on, and the policy in force.
                    "grounds": _GROUNDS,
                },
                ["call_id", "verdict"],
            ),
            False,
            "The verdict for a parked call. A reviewer's carries `grounds`: an approval runs only while the "
            "reviewer still holds them (approval/voided otherwise).",
            lambda d: [
                ("pending_approvals = CASE WHEN pending_approvals > 0 THEN pending_approvals - 1 ELSE 0 END", []),
                ("blocked_seq = NULL", []),
            ],
        ),
        Kind(
            "approval/voided",
            _obj(
                {"call_id": _NONEMPTY, "request_seq": _SEQ, "verdict_seq": _SEQ, "reason": _NONEMPTY, "by": _STR},
                ["call_id", "request_seq", "verdict_seq", "reason"],
            ),
            False,
            "An approval found void when its call was about to run (its reviewer `by` lost the authority it was "
            "given on, or the session was revoked since): the call did not run and is asked about again (an "
            "approval/requested follows in the same transaction).",
        ),
        Kind(
            "approval/reminded",
            _obj(
                {"call_id": _NONEMPTY, "request_seq": _SEQ, "n": {"type": "integer", "minimum": 1}, "waited_s": _SECS},
                ["call_id", "request_seq", "n", "waited_s"],
            ),
            False,
            "The approval clock: request `request_seq` still waits for a verdict (the n-th reminder).",
        ),
        Kind(
            "approval/escalated",
            _obj(
                {"call_id": _NONEMPTY, "request_seq": _SEQ, "to": {"type": ["string", "null"]}, "waited_s": _SECS},
                ["call_id", "request_seq", "to", "waited_s"],
            ),
            False,
            "The approval clock: the request's deadline passed and it stays parked; it is escalated to the "
            "group `to` (null: no group is named).",
        ),
        Kind(
            "approval/expired",
            _obj(
                {
                    "call_id": _NONEMPTY,
                    "request_seq": _SEQ,
                    "deadline_s": {"type": "integer", "minimum": 1},
                    "on_expiry": {"enum": list(ON_EXPIRY)},
                },
                ["call_id", "request_seq", "deadline_s", "on_expiry"],
            ),
            False,
            "The approval clock: no verdict came within the deadline. Never a human's denial: with on_expiry "
            "`deny` it settles the request (the model is told it expired; a later verdict is refused, "
            "approval_expired); with `park` the request stays open, escalated.",
            lambda d: (
                [
                    ("pending_approvals = CASE WHEN pending_approvals > 0 THEN pending_approvals - 1 ELSE 0 END", []),
                    ("blocked_seq = NULL", []),
                ]
                if d["on_expiry"] == "deny"
                else []
            ),
        ),
        Kind(
            "session/titled",
            _obj({"title": {"type": "string", "minLength": 1, "maxLength": 80}, "by": _STR}, ["title"]),
            False,
            "The session's title (at most 80 characters); the latest wins. `by` names the person who renamed "
            "the session (absent: the titler). Never model-visible.",
            lambda d: [("title = %s", [d["title"]])],
        ),
        Kind(
            "session/archived",
            _obj({"by": _STR}),
            False,
            "The owner archived the session: hidden from the session list, its agent disposed of and its "
            "schedules cancelled; the log stays readable. session/unarchived shows it again.",
            lambda d: [("archived_at = CURRENT_TIMESTAMP", [])],
        ),
        Kind(
            "session/unarchived",
            _obj({"by": _STR}),
            False,
            "The session is listed again; its agent respawns with its next input.",
            lambda d: [("archived_at = NULL", [])],
        ),
        Kind(
            "storage/cold",
            _obj(
                {
                    "through_seq": _SEQ,
                    "events": _SEQ,
                    "bytes": {"type": "integer", "minimum": 0},
                    "stored_bytes": {"type": "integer", "minimum": 0},
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "by": _STR,
                },
                ["through_seq", "events", "bytes", "stored_bytes", "sha256"],
            ),
            False,
            "Storage tiering (docs/storage.md): the session's events up to through_seq moved out of the event "
            "table into a compressed segment (its checksum here); this event is the tombstone the table keeps. "
            "`by`: the staff member, or `policy` (the profile's cold_after_days).",
            lambda d: [("storage_tier = 'cold'", []), ("cold_seq = %s", [d["through_seq"]])],
        ),
        Kind(
            "storage/hot",
            _obj({"through_seq": _SEQ, "events": {"type": "integer", "minimum": 0}, "by": _STR}, ["through_seq"]),
            False,
            "A cold session's events are back in the event table, with their own seqs (checksum verified). "
            "`by`: a staff member, or empty when a touch of the session read it back.",
            lambda d: [("storage_tier = 'hot'", []), ("cold_seq = NULL", [])],
        ),
        Kind(
            "storage/deleted",
            _obj(
                {
                    "through_seq": {"type": "integer", "minimum": 0},
                    "events": {"type": "integer", "minimum": 0},
                    "by": _STR,
                },
                ["through_seq"],
            ),
            False,
            "The profile's delete_cold_after_days removed a cold session's archived events for good: the log "
            "now starts after through_seq.",
            lambda d: [("storage_tier = 'deleted'", [])],
        ),
        Kind(
            "policy/updated",
            _obj(
                {
                    "patterns": {"type": "array", "items": _NONEMPTY},
                    "by": _STR,
                    # Tools a reviewer allowed to run without asking, for the rest of the session.
                    "auto_approve": {"type": "array", "items": _NONEMPTY},
                    # Per waived tool, the grounds of the reviewer who allowed it (permissions.grounds_of);
                    # the gate checks them again before a waived call runs.
                    "grants": {"type": "object", "additionalProperties": {"type": "object"}},
                },
                ["patterns"],
            ),
            False,
            "The session's allow-list patterns from now on.",
            lambda d: [("policy_seq = NEW_SEQ", [])],
        ),
        Kind(
            "model/updated",
            _obj({"role": {"enum": list(MODEL_ROLES)}, "spec": _NONEMPTY, "by": _STR}, ["role", "spec"]),
            False,
            "Repoints a model role for this session, in force at the next step.",
            # The role is one of MODEL_ROLES (validated above), so the column exists.
            lambda d: [(f"model_{d['role']} = %s", [d["spec"]])],
        ),
        Kind(
            "model/window",
            _obj(
                {
                    "role": {"enum": list(MODEL_ROLES)},
                    "spec": _NONEMPTY,
                    "tokens": {"type": "integer", "minimum": 1},
                    "source": {"enum": ["error", "refusal"]},
                },
                ["spec", "tokens", "source"],
            ),
            False,
            "A model's context window, learned from the provider's context-length error (`source` error: the "
            "limit it stated; refusal: it stated none, and the refused request's estimate was halved); it "
            "applies from now on to every session using the model (ModelWindow), with a profile's declared "
            "window the smaller counts.",
            None,
            lambda d: [(_MODEL_WINDOW_UPSERT, [d["spec"], int(d["tokens"])])],
        ),
        Kind(
            "agent/spawned",
            _obj(
                {"agent_id": _NONEMPTY, "profile": _NONEMPTY, "live": {"type": "integer", "minimum": 1}},
                ["agent_id", "profile"],
            ),
            False,
            "A live agent was spawned for this session (on its first stimulus, or again after a disposal). "
            "`live` counts the live agents with this one, under the registry lock.",
            lambda d: [("waiting_seq = NULL", [])],
        ),
        Kind(
            "agent/waiting",
            _obj({"reason": _STR, "live": {"type": "integer", "minimum": 0}}, ["reason"]),
            False,
            "The session has work but no registry slot (TERRET_MAX_AGENTS are live and busy); its input "
            "waits, durably, and runs when a slot frees.",
            lambda d: [("waiting_seq = NEW_SEQ", [])],
        ),
        Kind(
            "agent/disposed",
            _obj(
                {"agent_id": _NONEMPTY, "reason": {"enum": ["idle", "evicted", "operator"]}, "by": _STR}, ["agent_id"]
            ),
            False,
            "The live agent was disposed: idle past TERRET_AGENT_IDLE_SECONDS, evicted to make room for "
            "another session's agent, or by an operator. The next stimulus respawns it.",
        ),
        # --- forks (services/forks.py, docs/events.md "Forks") ---------------
        Kind(
            "session/forked",
            _obj(
                {
                    "parent": _NONEMPTY,
                    "at_seq": _SEQ,
                    "policy": {"enum": ["historical", "current", "fresh"]},
                    "seed_upto": _SEQ,
                    "requested_seq": _SEQ,
                    "by": _STR,
                },
                ["parent", "at_seq", "policy", "seed_upto"],
            ),
            False,
            "This session is a fork of `parent` as of the parent's `at_seq` (a fork point: no step open), "
            "inheriting by `policy`. Events up to `seed_upto` are the fork's seed (the parent's model-visible "
            "history, copied, and the inherited policy and model roles), written in one commit. "
            "`requested_seq`: the seq asked for, when the fork point was taken back to the last one before it.",
        ),
        Kind(
            "document/written",
            _obj(
                {
                    "name": _NONEMPTY,
                    "kind": _NONEMPTY,
                    "scope": {"enum": ["session", "conversation", "task"]},
                    "incarnation": _SEQ,
                    "version": _SEQ,
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "size": {"type": "integer", "minimum": 0},
                    "schema": _STR,
                    "schema_version": _SEQ,
                    "migrated_from": _SEQ,
                    "task": _STR,
                    "call_id": _STR,
                    "by": _STR,
                },
                ["name", "kind", "scope", "incarnation", "version", "sha256", "size"],
            ),
            False,
            "A document's new committed version (its content is stored by hash, not in the log).",
        ),
        Kind(
            "document/retired",
            _obj(
                {"name": _NONEMPTY, "incarnation": _SEQ, "reason": {"enum": ["deleted", "task_ended"]}, "by": _STR},
                ["name", "incarnation", "reason"],
            ),
            False,
            "A document's incarnation ends; writing the name again makes a new incarnation.",
        ),
        Kind(
            "task/started",
            _obj(
                {
                    "task_id": _NONEMPTY,
                    "kind": _NONEMPTY,
                    "version": _SEQ,
                    "background": {"type": "boolean"},
                    "call_id": _STR,
                    "argv": {"type": "array", "items": _STR},
                    "profile": _STR,
                    "child_session": _STR,
                },
                ["task_id", "kind", "version", "background"],
            ),
            False,
            "An owned task was admitted (runtime/owned/): a `command` (argv) or a `subagent` (profile, "
            "child_session), foreground (its turn waits on it) or background (it outlives its turn).",
        ),
        Kind(
            "task/waiting",
            _obj(
                {
                    "call_id": _NONEMPTY,
                    "task_ids": {"type": "array", "items": _NONEMPTY},
                    "live": {"type": "integer"},
                    "deadline_at": _STR,
                },
                ["call_id", "task_ids", "live"],
            ),
            False,
            "The open turn's call `call_id` (task.start in the foreground, task.wait) waits on these tasks; "
            "`live` of them had no terminal receipt yet. The turn parks (status waiting_task) until their receipts.",
            lambda d: [("waiting_tasks = waiting_tasks + %s", [int(d["live"])])],
        ),
        Kind(
            "task/progress",
            _obj({"task_id": _NONEMPTY, "age_s": _SECS, "output": _STR}, ["task_id", "age_s"]),
            False,
            "A running task's progress (at most one every TERRET_TASK_PROGRESS_SECONDS): its age and its output tail.",
        ),
        Kind(
            "task/wait_ended",
            _obj(
                {"call_id": _NONEMPTY, "reason": {"enum": ["timeout"]}, "live": {"type": "integer", "minimum": 0}},
                ["call_id", "reason", "live"],
            ),
            False,
            "A task.wait's `timeout_s` passed with `live` of its tasks still live: the wait ends (those come off "
            "waiting_tasks, and the session is woken); the tasks go on, and the call's result is their state now.",
            lambda d: [
                (
                    "waiting_tasks = CASE WHEN waiting_tasks > %s THEN waiting_tasks - %s ELSE 0 END",
                    [int(d["live"]), int(d["live"])],
                )
            ],
        ),
        *(
            Kind(
                f"task/{end}",
                _obj(
                    {
                        "task_id": _NONEMPTY,
                        "kind": _NONEMPTY,
                        "outcome": {"type": ["object", "null"]},
                        "reason": {"type": "object"},
                        "waited": {"type": "boolean"},
                        "generation": {"type": "integer", "minimum": 0},
                    },
                    ["task_id", "kind", "waited"],
                ),
                False,
                f"A task's terminal receipt ({end}): exactly one per task. `outcome` is a command's "
                "{exit_code, output} or a subagent's {answer}; `reason` says why it failed or was cancelled. "
                "`waited`: the open turn was parked on it (one off waiting_tasks); otherwise a background task's "
                "receipt comes with a follow-up (input/deferred with its task_id) that wakes the session.",
                lambda d: (
                    [("waiting_tasks = CASE WHEN waiting_tasks > 0 THEN waiting_tasks - 1 ELSE 0 END", [])]
                    if d["waited"]
                    else []
                ),
            )
            for end in ("completed", "failed", "cancelled")
        ),
        Kind(
            "task/blocked",
            _obj({"task_id": _NONEMPTY, "code": _NONEMPTY, "what": _STR, "reason": _STR}, ["task_id", "code"]),
            False,
            "A task whose kind or version the running code lacks (`definition_missing`): it stays live and "
            "visible, never dropped, until the definition is back or it is cancelled.",
        ),
        Kind(
            "session/forked_to",
            _obj(
                {
                    "child": _NONEMPTY,
                    "at_seq": _SEQ,
                    "policy": {"enum": ["historical", "current", "fresh"]},
                    "by": _STR,
                },
                ["child", "at_seq"],
            ),
            False,
            "A fork (`child`) was made of this session as of `at_seq`; nothing else of this session changes.",
        ),
    ]
}

MODEL_VISIBLE: frozenset[str] = frozenset(k.name for k in CATALOGUE.values() if k.model_visible)


def versions() -> dict[str, int]:
    """The event versions this code reads and writes: {kind: version}."""
    return {name: spec.version for name, spec in CATALOGUE.items()}


def unreadable(written: dict[str, int] | None, reads: dict[str, int] | None = None) -> str | None:
    """The first of a log's newest versions ({kind: version} above 1, as
    Session.event_versions keeps them) that code reading `reads` (default:
    this code's) cannot read, as "event:<kind>@<version>"; None if it reads all."""
    if not written:
        return None
    reads = versions() if reads is None else reads
    for kind, version in sorted(written.items()):
        if int(version) > reads.get(kind, 0):
            return f"event:{kind}@{version}"
    return None


def validate(kind: str, data: object) -> Kind:
    spec = CATALOGUE.get(kind)
    if spec is None:
        raise UnknownEventKind(f"unknown event kind {kind!r}")
    if not isinstance(data, dict):
        raise InvalidPayload(f"{kind}: payload must be a JSON object")
    if spec.validator.is_valid(data):
        return spec  # the common case; collecting errors costs more than checking
    errors = [
        f"{'/'.join(map(str, e.instance_path)) or '(root)'}: {e.message}" for e in spec.validator.iter_errors(data)
    ]
    if errors:
        raise InvalidPayload(f"{kind}: " + "; ".join(errors))
    return spec


def has_nul(value: Any) -> bool:
    """Whether a JSON-like value holds a NUL character anywhere (Postgres
    text and jsonb cannot store one)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v) for v in value)
    return False
