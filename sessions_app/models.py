"""The durable session log and what is projected from it.

`Event` rows are the truth. The projection columns on `Session` (title,
open turn, pending approvals, running usage totals, heads of some kinds) are
written only by `sessions_app.log` inside the same transaction that inserts
the event they summarize, so they can never disagree with the log.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NoReturn

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from sessions_app.errors import ImmutableEventError


def _setting(name: str) -> Any:
    return getattr(settings, name, None)


# Bounded by default: a new profile's defaults are settings read when it is
# made (callables, so a migration names the function, never a value).
def default_daily_cost_usd() -> Decimal | None:
    value = _setting("TERRET_PROFILE_DAILY_COST_USD")
    return None if value is None else Decimal(value)


def default_daily_tokens() -> int | None:
    return _setting("TERRET_PROFILE_DAILY_TOKENS")


def default_schedule_max_runs() -> int | None:
    return _setting("TERRET_SCHEDULE_MAX_RUNS")


def default_schedule_expires_days() -> int | None:
    return _setting("TERRET_SCHEDULE_EXPIRES_DAYS")


class AgentProfile(models.Model):
    """An admin-managed template that live agents are spawned from."""

    SUMMARIZER_CHOICES = [("role", "Compactor model role"), ("morph", "Morph Compact API")]
    ON_EXPIRY_CHOICES = [("deny", "Deny the call"), ("park", "Stay parked, escalated")]

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    # {"main": "provider/model", "titler": "...", "compactor": "..."}; empty
    # values fall back to TERRET_MODEL_* and then to the offline demo model.
    roles = models.JSONField(default=dict, blank=True)
    builtin_tools = models.JSONField(default=list, blank=True, help_text="Built-in tool names, e.g. clock.now")
    # [{"name": "time", "command": "python", "args": [...], "env": {...}}]
    mcp_servers = models.JSONField(default=list, blank=True)
    allow_floor = models.JSONField(
        default=list, blank=True, help_text="Allow-list glob patterns in force until a session updates its policy"
    )
    # {"tool.name": "never" | "policy" | "always"} overriding each tool's default,
    # or {"tool.name": {"mode": ..., "approval_deadline_s": ..., "remind_every_s": ...,
    # "escalate_to": "<group>", "on_expiry": ...}} with the tool's own deadline settings
    approvals = models.JSONField(default=dict, blank=True)
    compaction_budget = models.PositiveIntegerField(default=100_000)
    # Approval deadlines, opt-in (approvals_app/deadlines.py): none by default,
    # so a parked call waits for a human as long as it takes (seed 000). A
    # tool's entry in `approvals` may be an object with its own settings.
    approval_deadline_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds a request for approval waits for a verdict (blank: no deadline)"
    )
    remind_every_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Remind the reviewers every this many seconds while a request waits"
    )
    escalate_to = models.ForeignKey(
        "auth.Group",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The group a request is escalated to when its deadline passes and it stays parked",
    )
    on_expiry = models.CharField(max_length=8, choices=ON_EXPIRY_CHOICES, default="deny")
    # {"main": 128000, "compactor": 32000}: the context window, in tokens, of a
    # role's model; a role left out has none declared (one may be learned from
    # a provider's context-length error: ModelWindow).
    # Per-UTC-day ceilings over every session of the profile (None: none);
    # the global ones are settings (TERRET_DAILY_*). See runtime/limits.py.
    # A new profile gets TERRET_PROFILE_DAILY_* (bounded by default); blank is no limit.
    daily_cost_usd = models.DecimalField(
        max_digits=20, decimal_places=6, null=True, blank=True, default=default_daily_cost_usd
    )
    daily_tokens = models.BigIntegerField(null=True, blank=True, default=default_daily_tokens)
    daily_steps = models.BigIntegerField(null=True, blank=True)
    daily_turns = models.BigIntegerField(null=True, blank=True)
    context_windows = models.JSONField(
        default=dict, blank=True, help_text='Context window in tokens per model role, e.g. {"main": 128000}'
    )
    # Scheduled wake-ups (runtime/schedules.py): how many live schedules one
    # session may hold, the shortest recurrence, and after how many
    # consecutive runs without progress a schedule pauses itself.
    max_schedules = models.PositiveIntegerField(default=20)
    min_schedule_seconds = models.PositiveIntegerField(default=60)
    schedule_pause_after = models.PositiveIntegerField(default=3)
    # A recurring schedule made without its own max_runs / expires_at gets
    # these (None: none); a new profile gets TERRET_SCHEDULE_MAX_RUNS and
    # TERRET_SCHEDULE_EXPIRES_DAYS.
    schedule_max_runs = models.PositiveIntegerField(
        null=True, blank=True, default=default_schedule_max_runs, validators=[MinValueValidator(1)]
    )
    schedule_expires_days = models.PositiveIntegerField(
        null=True, blank=True, default=default_schedule_expires_days, validators=[MinValueValidator(1)]
    )
    # ["main"]: the model roles whose model takes images; a tool's images go
    # to those as image parts, to every other role as a text description.
    image_roles = models.JSONField(
        default=list, blank=True, help_text='Model roles whose model accepts images, e.g. ["main"]'
    )
    summarizer = models.CharField(max_length=16, choices=SUMMARIZER_CHOICES, default="role")
    # What the sweep does about a turn that made no progress for
    # TERRET_STALL_SECONDS (runtime/progress.py): report it (turn/stalled), or
    # report it and cancel the turn.
    ON_STALL_CHOICES = [("report", "Report it (turn/stalled)"), ("cancel", "Report it and cancel the turn")]
    on_stall = models.CharField(max_length=16, choices=ON_STALL_CHOICES, default="report")
    # Pending work, bounded (docs/storage.md, "Bounded pending work"): input
    # that would wait past either bound is refused (409 inbox_full); passive
    # writes keep the newest max_passive_inputs, the oldest withdrawn.
    max_waiting_inputs = models.PositiveIntegerField(default=1000, validators=[MinValueValidator(1)])
    max_waiting_bytes = models.PositiveIntegerField(default=8 * 1024 * 1024, validators=[MinValueValidator(1024)])
    max_passive_inputs = models.PositiveIntegerField(default=100, validators=[MinValueValidator(1)])
    # Storage tiering (docs/storage.md): None keeps every session hot (the
    # default); a session quiet this many days moves cold (the sweep), and a
    # cold one's archive is deleted this many days after it moved.
    cold_after_days = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    delete_cold_after_days = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    system_prompt = models.TextField(blank=True)
    # Owned work (runtime/owned/): the argv[0] glob patterns a `command` task
    # may run (none by default, so nothing runs), and the bounds on subagents:
    # how deep a tree of child sessions may grow, and how many live children
    # one session may own.
    command_allow = models.JSONField(
        default=list, blank=True, help_text='Glob patterns argv[0] of a command task must match, e.g. ["sh", "make"]'
    )
    max_task_depth = models.PositiveIntegerField(default=3)
    max_live_children = models.PositiveIntegerField(default=8)
    created_at = models.DateTimeField(default=timezone.now)
    # When a session moves to the profile's newest version (AgentVersion):
    # at its next turn's opening, or only when an owner or operator upgrades it.
    UPGRADE_POLICIES = [("next_turn", "Next turn opens on the newest version"), ("pinned", "Pinned until upgraded")]
    upgrade_policy = models.CharField(max_length=16, choices=UPGRADE_POLICIES, default="next_turn")
    # Documents (runtime/documents.py): the agent's world in the database.
    # Storage bounds, read from the live row at every write (not the turn's
    # version): an operator lowering one means it from the next write on.
    max_document_bytes = models.PositiveIntegerField(default=1024 * 1024)
    max_session_document_bytes = models.PositiveBigIntegerField(default=64 * 1024 * 1024)
    max_documents = models.PositiveIntegerField(default=1000)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AgentVersion(models.Model):
    """One immutable definition of a profile: everything a turn depends on
    (runtime/versions.py builds the snapshot and records a version whenever a
    save changes its digest). A turn runs to its end under the version its
    turn/start names."""

    profile = models.ForeignKey(AgentProfile, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    digest = models.CharField(max_length=64)
    snapshot = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["profile", "-number"]
        constraints = [models.UniqueConstraint(fields=["profile", "number"], name="agent_version_number")]

    def __str__(self) -> str:
        return f"{self.profile_id} v{self.number}"


class Session(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="terret_sessions")
    profile = models.ForeignKey(AgentProfile, on_delete=models.PROTECT, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    # Log head: the seq of the newest committed event (0 for an empty log).
    last_seq = models.BigIntegerField(default=0)
    last_event_at = models.DateTimeField(null=True, blank=True)

    # Projections maintained by the append transaction.
    title = models.CharField(max_length=80, blank=True)
    open_turn_seq = models.BigIntegerField(null=True, blank=True)
    pending_approvals = models.IntegerField(default=0)
    compacted_seq = models.BigIntegerField(null=True, blank=True)
    policy_seq = models.BigIntegerField(null=True, blank=True)
    inbox_seq = models.BigIntegerField(default=0)
    # Seq of the newest input/queued: input is pending iff it is > inbox_seq,
    # which lets a worker tell "nothing queued" without reading the log.
    last_input_seq = models.BigIntegerField(default=0)
    # The session's model-role overrides: the spec of its latest
    # model/updated per role ('' = none; the profile's role applies).
    model_main = models.TextField(blank=True, default="")
    model_titler = models.TextField(blank=True, default="")
    model_compactor = models.TextField(blank=True, default="")
    steps = models.BigIntegerField(default=0)
    unpriced_entries = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=10, default=Decimal(0))

    # Lease: one worker drives a session at a time. Each claim bumps
    # lease_gen; turn code's appends are fenced on the generation it holds.
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_gen = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The liveness key of the worker process holding the lease (runtime/
    # liveness.py): while that process lives, PostgreSQL holds its advisory
    # lock; once the lock is free, the lease may be taken over at once.
    lease_process = models.IntegerField(null=True, blank=True)
    # The lease holder's progress mark (runtime/progress.py): when its model
    # stream last gave text, and how many text chunks the current model call
    # has streamed. Written with the keeper's lease renewal, never per token,
    # so they lag by up to a third of the lease.
    progress_at = models.DateTimeField(null=True, blank=True)
    streamed_tokens = models.BigIntegerField(default=0)

    # Turn health, projected from the log: the turn/blocked that stopped the
    # open turn's retries (None: not blocked), the open turn's
    # turn/cancel_requested, and the agent/waiting of a session whose agent
    # waits for a registry slot.
    blocked_seq = models.BigIntegerField(null=True, blank=True)
    cancel_seq = models.BigIntegerField(null=True, blank=True)
    waiting_seq = models.BigIntegerField(null=True, blank=True)
    # The open turn's attempts of unknown outcome (tool/unknown) that no
    # operator has resolved yet; while any is, the turn waits (status
    # waiting_reconcile). A turn/end starts it over.
    unknown_effects = models.IntegerField(default=0)
    # The open turn's latest turn/stalled of no progress ({since, phase}); it
    # stands while nothing happened after it (runtime/progress.py, stalled_since).
    stalled_seq = models.BigIntegerField(null=True, blank=True)
    # Every turn's attempts of unknown outcome not resolved yet, open turn or
    # closed: what /ops/ and /metrics show until an operator answers. No
    # turn/end starts it over.
    unresolved_effects = models.IntegerField(default=0)
    # Owned tasks the open turn waits on (task/waiting adds the live ones, each
    # waited task's terminal receipt takes one off; turn/end starts it over):
    # while any is, the turn is parked in status waiting_task, holding no
    # worker and no lease (runtime/owned/).
    waiting_tasks = models.IntegerField(default=0)

    # The session's budget (its latest budget/updated; None: no limit) and
    # the turns it opened, beside the usage totals above (runtime/limits.py).
    budget_cost_usd = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    budget_tokens = models.BigIntegerField(null=True, blank=True)
    budget_steps = models.BigIntegerField(null=True, blank=True)
    budget_turns = models.BigIntegerField(null=True, blank=True)
    turns = models.BigIntegerField(default=0)
    # The oldest input held because a budget was exhausted (input/held), until
    # a turn takes it in; the sweep offers it again (a new day, a raised budget).
    held_seq = models.BigIntegerField(null=True, blank=True)
    # An operator's hold on the session (session/suspended: admission stops,
    # the running turn parks at its next step boundary; session/revoked: the
    # turn is cancelled, tools are denied and input is refused until restored).
    suspended_seq = models.BigIntegerField(null=True, blank=True)
    revoked_seq = models.BigIntegerField(null=True, blank=True)
    # Set when the owner archives the session (services.archive_session):
    # hidden from the session list, its agent disposed; the log stays.
    archived_at = models.DateTimeField(null=True, blank=True)
    # The later lanes (input/deferred: follow-ups and passive writes), which
    # wait for a turn boundary instead of riding the running turn: the newest
    # one's seq, the cursor a turn's opening has taken them in to (a prefix:
    # see runtime/admission.py), and the follow-ups still waiting, so the
    # sweep can find an idle session owed a turn without reading the log.
    deferred_seq = models.BigIntegerField(default=0)
    deferred_cursor = models.BigIntegerField(default=0)
    queued_follow_ups = models.IntegerField(default=0)
    # Woken steers (input/queued with wake) that may still wait: raised by
    # each, zeroed by the placement or withdrawal that takes the steer lane's
    # cursor up to its newest input. A steer that arrived as a turn ended is
    # owed the next turn; if the worker died between the two, nothing else
    # would wake the session (its wake-up was spent while the lease was
    # busy), so the sweep's owed() looks here. A counter, not a comparison of
    # the two cursors: PostgreSQL estimates a column-to-column comparison at
    # a third of the rows and then scans (docs/scaling.md, section 1).
    woken_steers = models.IntegerField(default=0)
    # The AgentVersion number the session runs under (its open turn's, else
    # its last turn's or an upgrade's); written by turn/start and
    # session/upgraded. None: no turn has opened since versions exist.
    agent_version = models.IntegerField(null=True, blank=True)
    # The newest schema version written per event kind, for kinds written
    # above version 1 only ({kind: version}; NULL: every event is version 1).
    # The append of such an event keeps it (log/backends); a claim reads it
    # so a worker never drives a log it cannot read (runtime/codever.py).
    event_versions = models.JSONField(null=True, blank=True)
    # Storage (docs/storage.md, "Tiering"): the UTF-8 bytes of every event's
    # payload the log holds (kept by every append; hot and cold alike), and
    # the tier: "cold" while the events up to cold_seq sit in a compressed
    # ColdSegment instead of the event table (storage/cold, storage/hot).
    log_bytes = models.BigIntegerField(default=0)
    storage_tier = models.CharField(max_length=8, default="hot")
    cold_seq = models.BigIntegerField(null=True, blank=True)
    # The session whose subagent task made this one (runtime/owned/subagent.py),
    # set once at creation: a claim reads it with the row, so a step of a
    # session with no parent walks no tree for its budgets (runtime/limits.py).
    parent_session = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )

    class Meta:
        ordering = ["-created_at"]
        # Every append updates this row, so no column an append writes is
        # indexed (last_event_at included: lists sort their own sessions):
        # then PostgreSQL can update it in place (HOT), touching no index.
        indexes = [
            models.Index(fields=["owner", "-created_at"]),
            # Only sessions waiting for an agent slot: the registry hands freed
            # slots to them after every turn. Partial, and on a column ordinary
            # appends leave alone, so those stay HOT.
            models.Index(fields=["waiting_seq"], condition=models.Q(waiting_seq__isnull=False), name="session_waiting"),
            models.Index(fields=["held_seq"], condition=models.Q(held_seq__isnull=False), name="session_held"),
            # Sessions with a follow-up waiting (the sweep's owed()): partial, and
            # only follow-ups and their placements write the column.
            models.Index(
                fields=["queued_follow_ups"], condition=models.Q(queued_follow_ups__gt=0), name="session_owed"
            ),
            # Sessions with a woken steer that may wait (owed() too); only
            # queued input and its placements write the column.
            models.Index(fields=["woken_steers"], condition=models.Q(woken_steers__gt=0), name="session_woken"),
            # Open turns, apart: the sweep reads only those not parked on an
            # approval, the approvals badge only those that are, so neither
            # scans the idle sessions (docs/scaling.md). Only turn/start,
            # turn/end and approvals write these columns: the rest stay HOT.
            models.Index(
                fields=["open_turn_seq"],
                condition=models.Q(open_turn_seq__isnull=False, pending_approvals=0),
                name="session_open_turn",
            ),
            models.Index(
                fields=["pending_approvals"],
                condition=models.Q(open_turn_seq__isnull=False, pending_approvals__gt=0),
                name="session_parked",
            ),
        ]

    def __str__(self) -> str:
        return self.title or str(self.id)

    @property
    def status(self) -> str:
        """idle, running, waiting_approval, waiting_task, waiting_reconcile, blocked, suspended or revoked (an open
        turn held by an operator), derived from the log's projections."""
        if self.open_turn_seq is None:
            return "idle"
        if self.revoked_seq is not None:
            return "revoked"
        if self.suspended_seq is not None:
            return "suspended"
        if self.blocked_seq is not None:
            return "blocked"
        if self.unknown_effects > 0:
            return "waiting_reconcile"
        if self.pending_approvals > 0:
            return "waiting_approval"
        if self.waiting_tasks > 0:
            return "waiting_task"
        return "running"


class EventQuerySet(models.QuerySet["Event"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise ImmutableEventError("events are append-only; update is refused")

    def delete(self) -> NoReturn:  # type: ignore[override]
        raise ImmutableEventError("events are append-only; delete is refused")

    def bulk_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ImmutableEventError("events are append-only; bulk_update is refused")


# The kinds a model step writes (its start and end, the reply, a call's
# attempt and result): no index by kind holds them (Event.Meta).
STEP_EVENT_KINDS = ("assistant/message", "step/end", "step/start", "tool/attempt", "tool/result")


class Event(models.Model):
    # No index of its own: the unique (session, seq) index serves every
    # lookup by session, and each index is one more write per event. No
    # constraint in PostgreSQL either (migration 0041): the one writer
    # (log/backends) inserts events only from the session row its own
    # statement has just updated, so the per-event check proved nothing more
    # and cost a row lock on the session, a WAL record per append. A session
    # is never deleted (PROTECT refuses it through the ORM).
    session = models.ForeignKey(
        Session, on_delete=models.PROTECT, related_name="events", db_index=False, db_constraint=False
    )
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=64)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    # The schema version of its kind it was written with (catalogue.Kind.version).
    # The database's default: an append of a version-1 event never names it.
    version = models.PositiveSmallIntegerField(default=1, db_default=1)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["session", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="event_session_seq_uniq")]
        # Latest-of-a-kind lookups (compaction, policy, title, model roles)
        # walk this index backwards instead of scanning the log. It leaves out
        # the kinds every model step writes (STEP_EVENT_KINDS: most of a log),
        # which a scan of the (session, seq) index finds within a few rows, so
        # an append of one of them writes two index entries, not three. On
        # SQLite the index is whole (migration 0040): its planner cannot match
        # a partial index to a query's bound parameters.
        indexes = [
            models.Index(
                fields=["session", "kind", "seq"],
                name="event_rare_kind_seq",
                condition=~models.Q(kind__in=STEP_EVENT_KINDS),
            )
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.kind}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise ImmutableEventError("events are written only by sessions_app.log.append")

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ImmutableEventError("events are append-only; delete is refused")


class ColdSegment(models.Model):
    """A cold session's events (seqs first_seq..last_seq), compressed, with
    the checksum of the uncompressed bytes (log/tiering.py). `data` holds
    them for the database store; another store (an object store) would keep
    its key in `location` and leave `data` empty."""

    session = models.ForeignKey(Session, on_delete=models.PROTECT, related_name="cold_segments")
    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField()
    events = models.IntegerField()
    raw_bytes = models.BigIntegerField()
    stored_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    codec = models.CharField(max_length=16, default="zlib")
    store = models.CharField(max_length=16, default="database")
    location = models.CharField(max_length=500, blank=True)
    data = models.BinaryField(blank=True, default=b"")
    created_at = models.DateTimeField(default=timezone.now)
    # Set when delete_cold_after_days removed the data: the row stays as the record of what was.
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "first_seq"], name="cold_segment_session_first")]

    def __str__(self) -> str:
        return f"{self.session_id} {self.first_seq}..{self.last_seq}"


class Agent(models.Model):
    """A live agent: one profile driving one session."""

    agent_id = models.SlugField(max_length=100, unique=True)
    session = models.OneToOneField(Session, on_delete=models.PROTECT, related_name="agent")
    profile = models.ForeignKey(AgentProfile, on_delete=models.PROTECT, related_name="agents")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.agent_id


class WorkerProcess(models.Model):
    """A live worker process, registered while it holds its liveness lock.

    `key` is the second half of a session-level advisory lock the process
    holds on a connection of its own; a row whose lock is free belongs to a
    dead process, and whoever notices deletes it and takes its turns over."""

    key = models.IntegerField(unique=True)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    # The code it runs (package version + git commit) and the event
    # versions that code reads ({kind: version}): runtime/codever.py.
    build = models.CharField(max_length=200, blank=True, default="")
    event_versions = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.host}:{self.pid} ({self.key})"


# The due times a schedule row is read back within. PostgreSQL holds times a
# Python datetime cannot (before year 1 or after 9999 in UTC): written by SQL,
# or by a version that did not check, such a row would fail every read of it.
DUE_READ_MIN = datetime(1, 1, 2, tzinfo=UTC)
DUE_READ_MAX = datetime(9999, 12, 30, tzinfo=UTC)


class ClampedDateTimeField(models.DateTimeField):  # type: ignore[type-arg]
    """A DateTimeField read through a clamp on PostgreSQL: a value outside
    [DUE_READ_MIN, DUE_READ_MAX] is selected as that bound, so every read of
    the row (the clock's claim, cancel, the admin, the pages) gets a datetime
    instead of the driver's error, and the clock can see the row is bad
    (`due_unreadable`) and mark it failed. Filters and ordering use the
    column itself (only the select list is clamped). The column is a plain
    timestamptz: migrations see a DateTimeField."""

    def select_format(self, compiler: Any, sql: str, params: Any) -> tuple[str, Any]:
        sql, params = super().select_format(compiler, sql, params)
        if compiler.connection.vendor != "postgresql":
            return sql, params  # SQLite rows are written only through Django, which cannot write such times
        lo, hi = f"'{DUE_READ_MIN.isoformat()}'::timestamptz", f"'{DUE_READ_MAX.isoformat()}'::timestamptz"
        clamped = f"CASE WHEN {sql} < {lo} THEN {lo} WHEN {sql} > {hi} THEN {hi} ELSE {sql} END"
        return clamped, (*params, *params, *params)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.DateTimeField", args, kwargs


def due_unreadable(when: datetime | None) -> bool:
    """Whether a due time read back is a clamped bound: the row holds a time
    outside what a datetime can hold."""
    return when is not None and (when <= DUE_READ_MIN or when >= DUE_READ_MAX)


class Schedule(models.Model):
    """A host-owned request to wake a session at a bounded time (seed 003's
    wake-up record). Firing it is an ordinary follow-up input plus a
    schedule/fired event in the session log (runtime/schedules.py); the row
    holds what the log does not: the next due time, runs, the last outcome."""

    STATUSES = ("pending", "claimed", "completed", "skipped", "failed", "cancelled", "paused")
    MISFIRES = ("skip", "run_once", "reschedule")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="schedules")
    # The next due time; None once the schedule will not fire again. Read
    # through a clamp: a row holding an impossible time must not fail its reads.
    due_at = ClampedDateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=200, blank=True)
    text = models.TextField()
    every_seconds = models.PositiveIntegerField(null=True, blank=True)
    cron = models.CharField(max_length=120, blank=True)
    misfire = models.CharField(max_length=16, choices=[(m, m) for m in MISFIRES], default="run_once")
    max_runs = models.PositiveIntegerField(null=True, blank=True)
    runs = models.PositiveIntegerField(default=0)
    # A recurring schedule stops at this time (None: no expiry); see the profile's schedule_expires_days.
    expires_at = models.DateTimeField(null=True, blank=True)
    # Tokens the turns it started may spend in all (None: no limit of its own).
    budget_tokens = models.BigIntegerField(null=True, blank=True)
    spent_tokens = models.BigIntegerField(default=0)
    # NULL, not "": the per-session uniqueness applies only to schedules that have a key.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(max_length=16, choices=[(s, s) for s in STATUSES], default="pending")
    status_reason = models.CharField(max_length=300, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # {"outcome": "ran" | "late" | "skipped", "at", "due_at", "late_seconds", "reason"}
    last_outcome = models.JSONField(null=True, blank=True)
    skipped = models.PositiveIntegerField(default=0)
    # The input/deferred seq of its latest firing (coalescing, progress), and
    # whether that run's outcome has been counted yet.
    last_input_seq = models.BigIntegerField(null=True, blank=True)
    last_run_counted = models.BooleanField(default=True)
    no_progress = models.PositiveIntegerField(default=0)
    # Bumped by every claim: a write about the schedule names the generation it read.
    generation = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["due_at", "created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="schedule_session_key_uniq",
            )
        ]
        indexes = [
            # The claim's scan: only pending schedules, by due time.
            models.Index(fields=["due_at"], condition=models.Q(status="pending"), name="schedule_due"),
            models.Index(fields=["session", "status"], name="schedule_session_status"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.reason or self.text[:40]} ({self.status})"


class InputReceipt(models.Model):
    """Admission record for an idempotent input: what became of it.

    Written in the same transaction as the input's events, so a retried
    request with the same key finds the original receipt, never a second turn.
    """

    session = models.ForeignKey(Session, on_delete=models.PROTECT, related_name="receipts")
    key = models.CharField(max_length=200)
    digest = models.CharField(max_length=64)
    disposition = models.CharField(max_length=16)
    seq = models.BigIntegerField()
    turn_seq = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "key"], name="receipt_session_key_uniq")]

    def __str__(self) -> str:
        return f"{self.session_id} {self.key} → {self.disposition}"


class Suspension(models.Model):
    """Admission suspended by an operator for a profile or for everything
    (a session's own is its session/suspended event). The row exists while
    the suspension holds; resuming deletes it. Every worker reads these
    (runtime/limits.py, at most a second old)."""

    SCOPES = [("global", "Everything"), ("profile", "One agent profile")]
    scope = models.CharField(max_length=16, choices=SCOPES)
    target = models.CharField(max_length=64, blank=True)  # the profile's name; "" for global
    by = models.CharField(max_length=150)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "target"], name="suspension_scope_target_uniq")]

    def __str__(self) -> str:
        return f"{self.scope} {self.target}".strip()


class OperatorAction(models.Model):
    """The operators' own log, append-only: every console action with its
    actor and reason (session actions are also events in the session's log)."""

    at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=32)
    scope = models.CharField(max_length=16)
    target = models.CharField(max_length=64, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.scope} {self.target}"


class ModelWindow(models.Model):
    """A model's context window as learned from a provider's context-length
    error (the model/window event's extra write), for every session that
    uses the model; the event in the session's log is the record."""

    spec = models.CharField(max_length=200, unique=True)
    tokens = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.spec}: {self.tokens} tokens"


class UsageDay(models.Model):
    """Usage per agent profile per UTC day, kept by the append transaction of
    step/end and usage/recorded events so the dashboard never scans logs.
    Several rows per profile and day (`shard`, TERRET_TALLY_SHARDS), summed
    by every reader, so that a profile's agents do not queue on one row's lock."""

    day = models.DateField()
    profile = models.ForeignKey(AgentProfile, on_delete=models.CASCADE, null=True, blank=True)
    steps = models.BigIntegerField(default=0)
    unpriced_entries = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=10, default=Decimal(0))
    # A database default too: the usage upserts (log/catalogue.py) name only their own columns.
    turns = models.BigIntegerField(default=0, db_default=0)
    # Which of the profile's day rows this is (runs.tally_shard): readers sum them.
    shard = models.SmallIntegerField(default=0, db_default=0)

    class Meta:
        ordering = ["-day"]
        constraints = [
            models.UniqueConstraint(fields=["day", "profile", "shard"], name="usageday_day_profile_shard_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.profile_id}"


class ApiToken(models.Model):
    """A bearer token for programs. Only a hash is stored; the token is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class TurnTally(models.Model):
    """Turns ended per agent profile per UTC day, by status and budget reason
    (the budget a rejected or stopped turn ran into; "" for none), kept by the
    append of turn/end (log/catalogue.py) so /metrics never scans logs."""

    day = models.DateField()
    profile = models.ForeignKey(AgentProfile, on_delete=models.CASCADE, null=True, blank=True)
    status = models.CharField(max_length=16)
    reason = models.CharField(max_length=16, blank=True)
    # A database default: the upsert names only its own columns.
    count = models.BigIntegerField(default=0, db_default=0)
    # Which of the profile's day rows this is (runs.tally_shard): readers sum them.
    shard = models.SmallIntegerField(default=0, db_default=0)

    class Meta:
        ordering = ["-day"]
        constraints = [
            models.UniqueConstraint(
                fields=["day", "profile", "status", "reason", "shard"], name="turntally_shard_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.profile_id} {self.status} {self.reason}".rstrip()


class ModelTally(models.Model):
    """Model requests with what they spent and took, per agent profile,
    model and UTC day, kept by the append of step/end (and the spend of
    usage/recorded) (log/catalogue.py)."""

    day = models.DateField()
    profile = models.ForeignKey(AgentProfile, on_delete=models.CASCADE, null=True, blank=True)
    # Text, not a bounded CharField: step/start does not bound a spec's length,
    # and an over-long one must not fail the append.
    model = models.TextField()
    requests = models.BigIntegerField(default=0, db_default=0)
    # From step/end and usage/recorded of this model: what it spent, and how
    # long its requests took (the runner's wall time of each call).
    prompt_tokens = models.BigIntegerField(default=0, db_default=0)
    completion_tokens = models.BigIntegerField(default=0, db_default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=10, default=Decimal(0), db_default=Decimal(0))
    latency_ms = models.BigIntegerField(default=0, db_default=0)
    timed = models.BigIntegerField(default=0, db_default=0)
    # Which of the profile's day rows this is (runs.tally_shard): readers sum them.
    shard = models.SmallIntegerField(default=0, db_default=0)

    class Meta:
        ordering = ["-day"]
        constraints = [
            models.UniqueConstraint(fields=["day", "profile", "model", "shard"], name="modeltally_shard_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.profile_id} {self.model}"


class RuntimeCounter(models.Model):
    """A counter of something worker processes do that no event records
    (sweep rounds), incremented by one atomic upsert so every process on
    every host adds to the same figure (runtime/sweep.py, /metrics)."""

    name = models.CharField(max_length=64, unique=True)
    value = models.BigIntegerField(default=0, db_default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class EffectAudit(models.Model):
    """The latest effect audit of one session's ledger (runtime/effects.py
    audit_recent, run by the sweep): what it found, for /ops/ and /metrics.
    `audited_seq` is the log head it read: a session whose log has moved on
    since is due again."""

    session = models.OneToOneField(Session, on_delete=models.CASCADE, primary_key=True, related_name="effect_audit")
    audited_seq = models.BigIntegerField(default=0)
    audited_at = models.DateTimeField(default=timezone.now)
    problems = models.JSONField(default=list, blank=True)
    found = models.PositiveIntegerField(default=0)  # len(problems), for the index
    counts = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            # /ops/ and /metrics read only the audits that found something.
            models.Index(fields=["audited_at"], condition=models.Q(found__gt=0), name="effect_audit_found"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}: {len(self.problems)} problem(s) at seq {self.audited_seq}"


# --- owned work (runtime/owned/, docs/protocol.md "Tasks") -------------------
# pending: admitted, no supervisor yet; running: a supervisor holds its lease;
# waiting: parked on an explicit wait; completing: the outcome is held, the
# terminal receipt not yet committed; done, failed, cancelled: the terminal
# receipt is in the owner's log (receipt_seq); blocked: its kind or version is
# not installed in the running code (never dropped: it stays live and visible).
TASK_PHASES = ("pending", "running", "waiting", "completing", "done", "failed", "cancelled", "blocked")
TASK_TERMINAL = ("done", "failed", "cancelled")
TASK_LIVE = ("pending", "running", "waiting", "completing", "blocked")


class Task(models.Model):
    """One unit of owned work: a typed phase machine with a durable
    checkpoint, owned by a session (and the turn that started it). Its
    `generation` fences every write of its supervisor the way lease_gen
    fences a turn's appends: a takeover bumps it, and the old supervisor's
    writes then match no row."""

    PHASES = [(p, p) for p in TASK_PHASES]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="tasks")
    turn_seq = models.BigIntegerField()
    # The tool call that started it: a resumed task.start finds its task here.
    call_id = models.CharField(max_length=200)
    kind = models.CharField(max_length=64)
    version = models.PositiveIntegerField(default=1)
    background = models.BooleanField(default=False)
    phase = models.CharField(max_length=16, choices=PHASES, default="pending")
    spec = models.JSONField(default=dict)  # what the kind runs: argv and timeout, or profile and prompt
    checkpoint = models.JSONField(default=dict, blank=True)
    generation = models.BigIntegerField(default=0)
    supervisor = models.CharField(max_length=200, blank=True)  # lease.owner_id() of its supervisor
    supervisor_process = models.IntegerField(null=True, blank=True)  # its liveness key (PostgreSQL)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    host = models.CharField(max_length=200, blank=True)  # where its process runs
    pgid = models.IntegerField(null=True, blank=True)  # the process group a cancel or a reaper kills
    abort_requested_at = models.DateTimeField(null=True, blank=True)
    abort_reason = models.CharField(max_length=200, blank=True)
    outcome = models.JSONField(null=True, blank=True)  # held at `completing`, final at the receipt
    reason = models.JSONField(null=True, blank=True)  # why it failed, was cancelled or is blocked
    output_tail = models.TextField(blank=True)  # a running command's output so far (bounded)
    receipt_seq = models.BigIntegerField(null=True, blank=True)  # its terminal receipt in the owner's log
    # The open turn and call parked on it (task.start foreground, task.wait).
    waiter_turn = models.BigIntegerField(null=True, blank=True)
    waiter_call = models.CharField(max_length=200, blank=True)
    child_session = models.OneToOneField(
        Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="parent_task"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [models.UniqueConstraint(fields=["session", "call_id"], name="task_per_call")]
        indexes = [
            # The reaper and /ops/ read only live tasks.
            models.Index(fields=["phase"], condition=models.Q(receipt_seq__isnull=True), name="task_live"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} task {self.id} ({self.phase})"

    @property
    def live(self) -> bool:
        return self.receipt_seq is None


# --- notifications (docs/notifications.md) ------------------------------------
# Settings: a person's (`PersonNotifications`: email on or off, a webhook URL
# and its secret), and a profile's (`ProfileNotifications`: which channels its
# sessions' notifications may use). No row means the default: email on, no
# webhook for a person; both channels for a profile. The outbox
# (`Notification`): one row per (event, recipient, channel), made after the
# event's commit and sent by the workers (sessions_app/notify/).
NOTIFY_CHANNELS = ("email", "webhook")
# pending: due at due_at; claimed: a sender holds it and has not started the send (its
# lease ends at due_at); sending: the send has started (a sender that dies now leaves it
# unknown, not resent); sent; unknown; failed: the attempts ran out; dropped: the person
# or profile turned the channel off meanwhile.
NOTIFY_STATUSES = ("pending", "claimed", "sending", "sent", "unknown", "failed", "dropped")
NOTIFY_OPEN = ("pending", "claimed", "sending")


class PersonNotifications(models.Model):
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="notify_settings"
    )
    email = models.BooleanField(default=True, help_text="Email me at my account's address.")
    webhook_url = models.CharField(max_length=2000, blank=True)
    # Write-only through every door: shown masked, never logged (sessions_app/notify/services.py).
    webhook_secret = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "person's notification settings"
        verbose_name_plural = "people's notification settings"

    def __str__(self) -> str:
        return f"notifications of user {self.user_id}"


class ProfileNotifications(models.Model):
    profile = models.OneToOneField(
        AgentProfile, on_delete=models.CASCADE, primary_key=True, related_name="notify_settings"
    )
    email = models.BooleanField(default=True, help_text="Its sessions' notifications may go by email.")
    webhook = models.BooleanField(default=True, help_text="Its sessions' notifications may go to webhooks.")

    class Meta:
        verbose_name = "profile's notification channels"
        verbose_name_plural = "profiles' notification channels"

    def __str__(self) -> str:
        return f"notification channels of {self.profile_id}"


class Notification(models.Model):
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=64)  # the event's kind
    name = models.CharField(max_length=64)  # the notification's (the webhook body's "event")
    recipient = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    channel = models.CharField(max_length=16, choices=[(c, c) for c in NOTIFY_CHANNELS])
    summary = models.TextField()
    status = models.CharField(max_length=16, choices=[(s, s) for s in NOTIFY_STATUSES], default="pending")
    # When a sender should look at the row next: a pending row's next attempt, a claimed
    # or sending row's lease expiry; null once it is closed.
    due_at = models.DateTimeField(null=True, blank=True, default=timezone.now)
    attempts = models.PositiveIntegerField(default=0)
    claim = models.CharField(max_length=32, blank=True)  # the current claim's token
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session", "seq", "recipient", "channel"], name="notification_event_recipient_channel"
            )
        ]
        indexes = [models.Index(fields=["due_at"], condition=models.Q(status__in=NOTIFY_OPEN), name="notification_due")]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.name} to {self.recipient_id} by {self.channel}"


# ---------------------------------------------------------------- documents


class DocumentContent(models.Model):
    """A document version's bytes, stored once per distinct content."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    data = models.BinaryField()
    size = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.size} bytes)"


DOCUMENT_SCOPES = ("session", "conversation", "task")


class Document(models.Model):
    """One incarnation of a named document of a session (runtime/documents.py).
    Recreating a retired name makes a new row with the next incarnation; a
    handle naming the old incarnation cannot reach the new one."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="documents")
    name = models.CharField(max_length=1024)
    kind = models.CharField(max_length=32)  # file, json, or kept as opaque data
    scope = models.CharField(max_length=16, choices=[(s, s) for s in DOCUMENT_SCOPES], default="conversation")
    incarnation = models.PositiveIntegerField(default=1)
    schema = models.CharField(max_length=200, blank=True)  # a json document's registered schema
    task = models.CharField(max_length=200, blank=True)  # a task-scoped document's task
    version = models.PositiveIntegerField(default=0)  # the head: its newest committed version
    size = models.PositiveBigIntegerField(default=0)  # the head's
    created_seq = models.BigIntegerField()
    retired_seq = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["session", "name", "incarnation"]
        constraints = [
            models.UniqueConstraint(fields=["session", "name", "incarnation"], name="document_incarnation_uniq"),
            models.UniqueConstraint(
                fields=["session", "name"], condition=models.Q(retired_seq__isnull=True), name="document_live_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}:{self.name}#{self.incarnation}"


class DocumentVersion(models.Model):
    """A committed version: the seq of its document/written in the session's
    log (or of the fork's session/forked for a version a fork inherited)."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    seq = models.BigIntegerField()
    content = models.ForeignKey(DocumentContent, on_delete=models.PROTECT, db_column="sha256")
    size = models.PositiveBigIntegerField()
    schema_version = models.PositiveIntegerField(null=True, blank=True)
    by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["document", "version"]
        constraints = [models.UniqueConstraint(fields=["document", "version"], name="document_version_uniq")]
        indexes = [models.Index(fields=["document", "seq"], name="document_version_seq")]

    def __str__(self) -> str:
        return f"{self.document_id} v{self.version}"


# -- monitors: recurring collection with coverage and a delivery ledger (seed 003) --------

MONITOR_STATUSES = ("active", "cancelled", "completed")
SCAN_COVERAGE = ("complete", "partial", "failed")
EDITION_STATUSES = ("prepared", "posting", "confirmed", "suppressed", "held", "unknown", "failed")
CANDIDATE_STATUSES = ("pending", "assigned", "delivered", "baseline")


class Monitor(models.Model):
    """A session's recurring collection job (sessions_app/monitors/). The host
    owns its schedule, its scans, its editions and their delivery; the row
    holds its timing (the fields a Schedule's timing reads: runtime/schedules.py
    `Timed`), the next due time and the lease of the worker running a period."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="monitors")
    sources = models.JSONField()  # [{"kind", "url", "partition", "name", "initial", "overlap_seconds"}]
    destination = models.JSONField()  # {"kind": "webhook", "url"} | {"kind": "email", "to"} | {"kind": "session"}
    quiet = models.CharField(max_length=16, default="suppress")
    # Who writes an edition's digest: "model" (the session's main model, from the candidates the host
    # hands it; the host's own list if the model fails) or "host".
    digest_by = models.CharField(max_length=8, default="host")
    every_seconds = models.PositiveIntegerField(null=True, blank=True)
    cron = models.CharField(max_length=120, blank=True)
    misfire = models.CharField(max_length=16, default="run_once")
    # A schedule's bounds (the profile's schedule_max_runs / schedule_expires_days when the request gave
    # none): the monitor completes after max_runs periods, or at expires_at. Timed by runtime/schedules.py.
    max_runs = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    due_at = ClampedDateTimeField(null=True, blank=True)
    periods = models.PositiveIntegerField(default=0)  # the last period whose edition was decided
    # The webhook signature's secret (write-once, never shown after creation).
    secret = models.CharField(max_length=80, blank=True)
    status = models.CharField(max_length=16, choices=[(s, s) for s in MONITOR_STATUSES], default="active")
    status_reason = models.CharField(max_length=300, blank=True)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # The worker running a period holds it until lease_until; an expired lease is anyone's.
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_token = models.CharField(max_length=32, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="monitor_session_key_uniq",
            )
        ]
        indexes = [models.Index(fields=["due_at"], condition=models.Q(status="active"), name="monitor_due")]

    def __str__(self) -> str:
        return f"monitor {self.id} of {self.session_id} ({self.status})"


class MonitorCheckpoint(models.Model):
    """A source partition's last committed collection checkpoint, per query
    revision: a changed query or a new partition starts its own."""

    monitor = models.ForeignKey(Monitor, on_delete=models.CASCADE, related_name="checkpoints")
    source = models.CharField(max_length=300)
    partition = models.CharField(max_length=120)
    revision = models.CharField(max_length=64)
    value = models.DateTimeField(null=True, blank=True)  # the newest item time a complete scan proved
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["monitor", "source", "partition", "revision"], name="monitor_checkpoint_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source} [{self.partition}] at {self.value}"


class SourceScan(models.Model):
    """One scan of one source partition, with its coverage and the evidence."""

    monitor = models.ForeignKey(Monitor, on_delete=models.CASCADE, related_name="scans")
    period = models.PositiveIntegerField()
    source = models.CharField(max_length=300)
    partition = models.CharField(max_length=120)
    revision = models.CharField(max_length=64)
    prior_checkpoint = models.DateTimeField(null=True, blank=True)
    cutoff = models.DateTimeField()  # when the scan started: what it can speak for
    boundary = models.DateTimeField(null=True, blank=True)  # the checkpoint it proved reached (complete only)
    coverage = models.CharField(max_length=16, choices=[(c, c) for c in SCAN_COVERAGE])
    pages = models.PositiveIntegerField(default=0)
    items = models.PositiveIntegerField(default=0)  # new candidates it added
    evidence = models.JSONField(default=dict)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["monitor", "source", "partition", "-id"], name="scan_monitor_partition")]

    def __str__(self) -> str:
        return f"scan {self.source} [{self.partition}] period {self.period}: {self.coverage}"


class Edition(models.Model):
    """One period's publication to one destination: its identity is bound to
    the monitor, the period and the destination."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    monitor = models.ForeignKey(Monitor, on_delete=models.CASCADE, related_name="editions")
    period = models.PositiveIntegerField()
    destination = models.CharField(max_length=300)
    status = models.CharField(max_length=16, choices=[(s, s) for s in EDITION_STATUSES], default="prepared")
    items = models.JSONField(default=list)  # [{"source", "id", "version", "title", "url"}]
    scans = models.JSONField(default=list)  # SourceScan ids
    coverage = models.JSONField(default=list)  # [{"source", "partition", "coverage", "error"}]
    digest = models.TextField(blank=True)
    digest_by = models.CharField(max_length=120, blank=True)  # "" until written: "model", or "host" (and why)
    receipt = models.CharField(max_length=300, blank=True)
    reason = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # An unknown edition is re-sent under the same Idempotency-Key only when
    # its destination honours one; otherwise it waits for an operator.
    resendable = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["monitor", "period", "destination"], name="edition_identity_uniq")
        ]
        indexes = [models.Index(fields=["monitor", "-period"], name="edition_monitor_period")]

    def __str__(self) -> str:
        return f"edition {self.id} period {self.period}: {self.status}"


class MonitorCandidate(models.Model):
    """An item version a scan found: pending, assigned to an edition being
    published, delivered (the ledger has it), or baseline (seen by a first
    run with `initial: now`: never to be sent)."""

    monitor = models.ForeignKey(Monitor, on_delete=models.CASCADE, related_name="candidates")
    source = models.CharField(max_length=300)
    item_id = models.CharField(max_length=500)
    version = models.CharField(max_length=100)
    title = models.TextField(blank=True)
    url = models.TextField(blank=True)
    item_time = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=[(s, s) for s in CANDIDATE_STATUSES], default="pending")
    edition = models.ForeignKey(Edition, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    scan = models.ForeignKey(SourceScan, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["monitor", "source", "item_id", "version"], name="candidate_item_uniq")
        ]
        indexes = [models.Index(fields=["monitor", "status"], name="candidate_monitor_status")]

    def __str__(self) -> str:
        return f"{self.item_id}@{self.version} ({self.status})"


class DeliveryLedger(models.Model):
    """An item version delivered by a confirmed edition, with its receipt:
    written only on a confirmed receipt, never twice for one version."""

    monitor = models.ForeignKey(Monitor, on_delete=models.CASCADE, related_name="deliveries")
    source = models.CharField(max_length=300)
    item_id = models.CharField(max_length=500)
    version = models.CharField(max_length=100)
    edition = models.ForeignKey(Edition, on_delete=models.CASCADE, related_name="deliveries")
    receipt = models.CharField(max_length=300)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["monitor", "source", "item_id", "version"], name="delivery_item_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.item_id}@{self.version} by {self.edition_id}"
