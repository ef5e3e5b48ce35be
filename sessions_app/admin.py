"""The admin: agent profiles (validated on save), live agents (read-only,
disposed by an action), sessions and their log (read-only), API tokens,
notifications (a profile's channels as an inline of its page; people's settings,
the secret never shown; the outbox, read-only, with "send again" for rows whose
outcome is unknown or whose attempts ran out).
Operators' actions (suspend, resume, revoke, restore) are admin actions on
sessions and profiles, through services/operators.py (reason "via admin")."""

from __future__ import annotations

from typing import Any

import django_stubs_ext
from django import forms
from django.contrib import admin, messages
from django.db.models import Q, QuerySet, Sum
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from sessions_app import services
from sessions_app.actions.words import compact_outcome, status_label
from sessions_app.errors import AgentBusy, InvalidInput, NotAllowed, TerretError, UnknownSession
from sessions_app.llm.providers import providers, unreachable
from sessions_app.log.catalogue import CATALOGUE
from sessions_app.models import (
    Agent,
    AgentProfile,
    ApiToken,
    Event,
    Notification,
    PersonNotifications,
    ProfileNotifications,
    Schedule,
    Session,
)
from sessions_app.notify import outbox
from sessions_app.notify import services as notify_services
from sessions_app.permissions import is_operator
from sessions_app.runtime.profiles import check_profile
from sessions_app.services import operators, schedules, storage, versions
from sessions_app.services.tokens import revoke
from sessions_app.services.usage import check_session
from sessions_app.tools.builtins import BUILTINS

# ModelAdmin[Model] and ModelForm[Model] below are written for mypy; this lets
# them run. Here, not in settings: it imports the admin, syndication and views
# into every process (terret_site/worker.py).
django_stubs_ext.monkeypatch()

# The profile's tool and model configuration, and what an empty field means.
CHECKED_FIELDS: dict[str, Any] = {
    "roles": dict,
    "builtin_tools": list,
    "mcp_servers": list,
    "approvals": dict,
    "context_windows": dict,
    "image_roles": list,
    "command_allow": list,
}


VIA_ADMIN = "via admin"
ACTION_LIMIT = 100


def operate(model_admin: admin.ModelAdmin[Any], request: HttpRequest, targets: list[str], label: str, act: Any) -> None:
    """Run `act(target, by)` for each target (an operators' service call), and say what happened."""
    if not is_operator(request.user):
        model_admin.message_user(request, "Operators' actions need active staff.", messages.ERROR)
        return
    by = request.user.get_username()
    done = []
    for target in targets[:ACTION_LIMIT]:
        try:
            act(target, by)
        except TerretError as exc:
            model_admin.message_user(request, f"{target}: not done: {exc}", messages.WARNING)
        else:
            done.append(target)
    if done:
        model_admin.message_user(request, f"{label}: {', '.join(done)}.", messages.SUCCESS)


class ProfileChecks(forms.ModelForm[AgentProfile]):
    """Checks the roles, tools, MCP servers, approval overrides and context windows as the
    runtime would use them (runtime/profiles.py), each problem on its field."""

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for field, empty in CHECKED_FIELDS.items():
            if field in cleaned and cleaned[field] is None:
                cleaned[field] = empty()  # a blank field is the empty configuration
        parsed = {field: cleaned.get(field, empty()) for field, empty in CHECKED_FIELDS.items()}
        for field, problems in check_profile(**parsed).items():
            if field in cleaned:  # a field that is not even JSON has its own error already
                for problem in problems:
                    self.add_error(field, problem)
        return cleaned


def tool_choices() -> list[tuple[str, str]]:
    """Each built-in tool as a checkbox label: its name, approval mode and replay policy."""
    return [
        (name, f"{name} · approval: {d.approval} · replay: {d.replay_policy} — {d.description}")
        for name, d in sorted(BUILTINS.items())
    ]


def model_help() -> str:
    """What the model field takes, and each configured provider with its key's state (read now)."""
    shown = "; ".join(f"{'⚠ ' if p.warning else ''}{p.label()}" for p in providers())
    return (
        "The main role's model, e.g. demo/offline or openai/gpt-4o-mini (blank: the roles field, then "
        f"TERRET_MODEL_MAIN, then the offline demo). Providers: {shown}."
    )


class ModelInput(forms.TextInput):
    """A text box with the configured providers' models as suggestions."""

    def __init__(self) -> None:
        super().__init__(attrs={"list": "profile-models", "size": 40})

    def render(self, name: str, value: Any, attrs: Any = None, renderer: Any = None) -> Any:
        options = format_html_join("", '<option value="{}">', ((spec,) for p in providers() for spec in p.examples))
        box = super().render(name, value, attrs, renderer)
        return format_html('{}<datalist id="profile-models">{}</datalist>', box, options)


class ToolChoices(forms.MultipleChoiceField):
    def valid_value(self, value: Any) -> bool:
        return True  # an unknown name gets check_profile's error, which lists the known ones


class AgentProfileForm(ProfileChecks):
    # Tool checkboxes from the registry (approval mode and replay policy in each label) instead of raw JSON.
    builtin_tools = ToolChoices(
        choices=tool_choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        label="Built-in tools",
        help_text="Tick the tools this profile's agents may call. approval: never runs without asking, policy asks "
        "before a mutating call unless the allow-list allows it, always asks; replay: what a resume does with a "
        "call whose outcome was not recorded (safe: runs it again, reconcile: asks the target, never: an operator "
        "decides).",
    )
    main_model = forms.CharField(max_length=200, required=False, label="Model (main role)", widget=ModelInput())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "main_model" in self.fields:
            self.fields["main_model"].help_text = model_help()  # read now: the key may have been set since start-up
            if self.instance.pk is not None and not self.is_bound:
                self.initial["main_model"] = (self.instance.roles or {}).get("main", "")
        tools = self.fields.get("builtin_tools")
        if isinstance(tools, ToolChoices):
            gone = [t for t in self.instance.builtin_tools or [] if isinstance(t, str) and t not in BUILTINS]
            # A tool a deploy removed stays visible (ticked) so the profile's owner sees it and unticks it.
            tools.choices = [*tool_choices(), *((t, f"{t} · not in this code any more") for t in gone)]

    def clean_main_model(self) -> str:
        return str(self.cleaned_data.get("main_model") or "").strip()

    class Meta:
        model = AgentProfile
        fields = [
            "name",
            "description",
            "roles",
            "builtin_tools",
            "mcp_servers",
            "allow_floor",
            "approvals",
            "approval_deadline_s",
            "remind_every_s",
            "escalate_to",
            "on_expiry",
            "compaction_budget",
            "context_windows",
            "image_roles",
            "summarizer",
            "system_prompt",
            "daily_cost_usd",
            "daily_tokens",
            "daily_steps",
            "daily_turns",
            "max_schedules",
            "min_schedule_seconds",
            "schedule_pause_after",
            "on_stall",
            "schedule_max_runs",
            "schedule_expires_days",
            "upgrade_policy",
            "max_waiting_inputs",
            "max_waiting_bytes",
            "max_passive_inputs",
            "cold_after_days",
            "delete_cold_after_days",
            "command_allow",
            "max_task_depth",
            "max_live_children",
            "created_at",
        ]
        help_texts = {
            "max_waiting_inputs": "Inputs that may wait per session (both lanes); more is refused: 409 inbox_full.",
            "max_waiting_bytes": "Bytes of input text that may wait per session; more is refused: 409 inbox_full.",
            "max_passive_inputs": "Passive writes a session keeps waiting; a newer one withdraws the oldest.",
            "cold_after_days": "Move a session quiet this many days to cold storage (blank: keep every session "
            "hot). A touch reads it back (docs/storage.md).",
            "delete_cold_after_days": "Delete a cold session's archived events this many days after they moved "
            "(blank: keep them).",
            "command_allow": 'Glob patterns argv[0] of a command task (task.start) must match, e.g. ["sh", "make"]; '
            "empty: no command runs.",
            "max_task_depth": "How deep a tree of subagents under a session of this profile may grow.",
            "max_live_children": "How many live subagents one session of this profile may own at once.",
            "max_schedules": "Pending or paused schedules one session may hold (0: none).",
            "min_schedule_seconds": "The shortest recurrence a schedule of this profile may have.",
            "schedule_pause_after": "A schedule pauses itself after this many runs in a row without progress.",
            "schedule_max_runs": "A recurring schedule made without its own max_runs stops after this many runs "
            "(blank: no limit). A new profile gets TERRET_SCHEDULE_MAX_RUNS.",
            "schedule_expires_days": "A recurring schedule made without its own expires_at stops this many days "
            "after it was made (blank: never). A new profile gets TERRET_SCHEDULE_EXPIRES_DAYS.",
            "daily_cost_usd": "The profile's budget per UTC day over all its sessions, in USD (blank: no limit). "
            "A new profile gets TERRET_PROFILE_DAILY_COST_USD.",
            "daily_tokens": "Prompt plus completion tokens per UTC day (blank: no limit). "
            "A new profile gets TERRET_PROFILE_DAILY_TOKENS.",
            "daily_steps": "Model steps per UTC day (blank: no limit).",
            "daily_turns": "Turns per UTC day (blank: no limit).",
            "on_stall": "What happens to a running turn with no progress for TERRET_STALL_SECONDS: reported "
            "(turn/stalled, /ops/), or reported and cancelled.",
            "on_expiry": "When a request's deadline passes: deny the call (the model is told it expired), or "
            "leave it parked and escalate it.",
            # Every JSON field says what it holds, with an example.
            "roles": 'A model per role; the Model field above sets main. Example: {"titler": "openai/gpt-4o-mini", '
            '"compactor": "openai/gpt-4o-mini"}. The roles: main, titler, compactor. Empty: {}.',
            "mcp_servers": "MCP servers whose tools this profile offers (named mcp.<server>.<tool>). Example: "
            '[{"name": "time", "command": "python", "args": ["-m", "mcp_server_time"], "env": {}}]. Empty: []. '
            'A stdio server with "workspace": true works in the session\'s documents: {workspace} in its args '
            "names a scratch directory of them, its changes saved back after each call.",
            "allow_floor": "Allow-list glob patterns in force until a session updates its policy; a tool no "
            'pattern matches is vetoed. Example: ["clock.*", "workspace.*", "mcp.time.*"]. Left empty, it '
            "becomes the ticked tools (and mcp.<server>.* for each MCP server).",
            "approvals": "Overrides of a tool's approval mode. Example: "
            '{"workspace.write": "always", "debug.charge": {"mode": "always", "approval_deadline_s": 600}}. '
            "Modes: never, policy, always. Empty: {}.",
            "context_windows": 'Context window in tokens per model role. Example: {"main": 128000}. Empty: {} '
            "(none declared; one may be learned from a provider's refusal).",
            "image_roles": 'Model roles whose model accepts images. Example: ["main"]. Empty: [] (tool images go '
            "to every role as a text description).",
        }

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        main = cleaned.get("main_model")
        if main and isinstance(cleaned.get("roles"), dict):
            cleaned["roles"] = {**cleaned["roles"], "main": main}
        for name in ("daily_cost_usd", "daily_tokens", "daily_steps", "daily_turns"):
            value = cleaned.get(name)
            if value is not None and value < 0:
                self.add_error(name, "A budget cannot be negative (blank: no limit).")
        return cleaned


class ProfileNotificationsInline(admin.StackedInline):  # type: ignore[type-arg]
    """On the profile's own page: which channels its sessions' notifications use."""

    model = ProfileNotifications
    can_delete = False
    max_num = 1
    verbose_name_plural = "notification channels (none saved: email and webhooks both on)"


@admin.register(AgentProfile)
class AgentProfileAdmin(admin.ModelAdmin[AgentProfile]):
    form = AgentProfileForm
    list_display = ["name", "summarizer", "compaction_budget", "upgrade_policy", "log_size", "created_at"]
    search_fields = ["name", "description"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentProfile]:
        return super().get_queryset(request).annotate(total_log_bytes=Sum("session__log_bytes"))

    @admin.display(description="log bytes (its sessions')", ordering="total_log_bytes")
    def log_size(self, obj: AgentProfile) -> str:
        return f"{int(getattr(obj, 'total_log_bytes', 0) or 0):,}"

    actions = ["suspend_profiles", "resume_profiles", "upgrade_sessions"]
    readonly_fields = ["agent_versions"]
    inlines = [ProfileNotificationsInline]  # which channels its sessions' notifications use (docs/notifications.md)

    @admin.display(description="Agent versions (newest first): sessions on each")
    def agent_versions(self, obj: AgentProfile) -> str:
        if obj.pk is None:
            return "version 1 is recorded on save"
        rows = versions.versions_of(obj)
        return "; ".join(f"v{v.number} ({v.digest[:12]}, {v.created_at:%Y-%m-%d %H:%M}): {v.sessions}" for v in rows)

    @admin.action(description="Upgrade these profiles' sessions to their newest version (pre-flight per session)")
    def upgrade_sessions(self, request: HttpRequest, queryset: QuerySet[AgentProfile]) -> None:
        if not is_operator(request.user):
            self.message_user(request, "Only operators may upgrade sessions.", messages.ERROR)
            return
        for profile in queryset[:ACTION_LIMIT]:
            out = versions.upgrade_profile(profile, None, by=str(request.user.get_username()))
            self.message_user(request, f"Profile {profile.name}: {len(out.upgraded)} upgraded to version {out.to}")
            for sid, reasons in list(out.refused.items())[:ACTION_LIMIT]:
                self.message_user(
                    request, f"Profile {profile.name}: {sid} refused: {'; '.join(reasons)}", messages.WARNING
                )

    @admin.action(description="Suspend admission for these profiles")
    def suspend_profiles(self, request: HttpRequest, queryset: QuerySet[AgentProfile]) -> None:
        names = list(queryset.values_list("name", flat=True)[:ACTION_LIMIT])
        operate(
            self,
            request,
            names,
            "Suspended admission for",
            lambda name, by: operators.suspend("profile", name, by=by, reason=VIA_ADMIN),
        )

    @admin.action(description="Resume admission for these profiles")
    def resume_profiles(self, request: HttpRequest, queryset: QuerySet[AgentProfile]) -> None:
        names = list(queryset.values_list("name", flat=True)[:ACTION_LIMIT])
        operate(
            self,
            request,
            names,
            "Resumed admission for",
            lambda name, by: operators.resume("profile", name, by=by, reason=VIA_ADMIN),
        )

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        base: Any = self.form
        if not issubclass(base, AgentProfileForm):
            # Another app gave this admin a form of its own (policies_app/admin.py
            # checks the allow floor): keep its checks and these, help texts and fields included.
            base = type(base.__name__, (AgentProfileForm, base), {"__module__": base.__module__})
        return super().get_form(request, obj, change, **{"form": base, **kwargs})

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The model right under the roles it sets; any other form field after the one it is about."""
        found = list(super().get_fields(request, obj))
        fields = [f for f in found if f not in ("main_model", "confirm_floor")]
        fields.insert(fields.index("roles"), "main_model")
        if "confirm_floor" in found:
            fields.insert(fields.index("allow_floor") + 1, "confirm_floor")
        return fields

    def save_model(self, request: HttpRequest, obj: AgentProfile, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        main = (obj.roles or {}).get("main")
        problem = unreachable(str(main)) if main else None
        if problem:  # saved, but said now rather than when the first turn fails on it
            self.message_user(request, f"Saved, but {problem}.", messages.WARNING)


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin[Agent]):
    """Live agents, read-only: the runtime spawns them (on a session's first
    stimulus) and disposes of them (idle, evicted); an operator may dispose of
    idle ones with the action."""

    list_display = ["agent_id", "session", "profile", "created_at"]
    search_fields = ["agent_id"]
    list_filter = ["profile"]
    list_select_related = ["session", "profile"]
    actions = ["dispose_selected"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a row deleted here would skip agent/disposed: use the action

    @admin.action(description="Dispose selected agents")
    def dispose_selected(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        by = request.user.get_username()
        done = 0
        for agent_id in list(queryset.values_list("agent_id", flat=True)[:100]):
            try:
                services.dispose_agent(agent_id, reason="operator", by=by)
            except AgentBusy as exc:
                self.message_user(request, f"{agent_id}: not disposed: {exc}", messages.WARNING)
            except InvalidInput as exc:  # disposed meanwhile
                self.message_user(request, f"{agent_id}: {exc}", messages.WARNING)
            else:
                done += 1
        if done:
            self.message_user(request, f"Disposed {done} agent(s).", messages.SUCCESS)


class StatusFilter(admin.SimpleListFilter):
    """By status, from the projection columns Session.status is derived from."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("idle", "idle"),
            ("running", "running"),
            ("waiting_approval", "waiting for approval"),
            ("waiting_task", "waiting for a task"),
            ("waiting_reconcile", "waiting for an operator"),
            ("blocked", "blocked"),
            ("waiting_slot", "waiting for an agent slot"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Session]) -> QuerySet[Session]:
        # In Session.status's order: blocked, then waiting_reconcile, then waiting_approval.
        open_turn = Q(open_turn_seq__isnull=False)
        match self.value():
            case "idle":
                return queryset.filter(open_turn_seq__isnull=True)
            case "running":
                return queryset.filter(
                    open_turn, blocked_seq__isnull=True, unknown_effects=0, pending_approvals=0, waiting_tasks=0
                )
            case "waiting_task":
                return queryset.filter(
                    open_turn, blocked_seq__isnull=True, unknown_effects=0, pending_approvals=0, waiting_tasks__gt=0
                )
            case "waiting_approval":
                return queryset.filter(open_turn, blocked_seq__isnull=True, unknown_effects=0, pending_approvals__gt=0)
            case "waiting_reconcile":
                return queryset.filter(open_turn, blocked_seq__isnull=True, unknown_effects__gt=0)
            case "blocked":
                return queryset.filter(open_turn, blocked_seq__isnull=False)
            case "waiting_slot":
                return queryset.filter(waiting_seq__isnull=False)
        return queryset


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin[Session]):
    list_display = ["id", "title", "status", "owner", "profile", "last_seq", "log_size", "storage_tier", "cost"]
    list_filter = [StatusFilter, "profile", "storage_tier", "owner"]
    search_fields = ["id", "title", "owner__username"]
    readonly_fields = [f.name for f in Session._meta.get_fields() if getattr(f, "concrete", False)]
    list_select_related = ["owner", "profile"]
    show_full_result_count = False
    actions = [
        "compact_selected",
        "check_usage",
        "suspend_sessions",
        "resume_sessions",
        "revoke_sessions",
        "restore_sessions",
        "move_cold",
        "move_hot",
    ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        total = Session.objects.aggregate(n=Sum("log_bytes"))["n"] or 0
        title = f"Sessions: {total:,} bytes of log in total (hot and cold; docs/storage.md)"
        return super().changelist_view(request, {**(extra_context or {}), "title": title})

    @admin.display(description="log bytes", ordering="log_bytes")
    def log_size(self, session: Session) -> str:
        return f"{session.log_bytes:,}"

    @admin.action(description="Move to cold storage (a touch reads it back)")
    def move_cold(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        operate(self, request, self._ids(queryset), "Moved cold", lambda sid, by: storage.set_tier(sid, "cold", by=by))

    @admin.action(description="Move back to hot storage")
    def move_hot(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        operate(self, request, self._ids(queryset), "Moved hot", lambda sid, by: storage.set_tier(sid, "hot", by=by))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the log below it is append-only

    @admin.display(description="status")
    def status(self, session: Session) -> str:
        """idle, running, waiting for approval, waiting for an operator or blocked; and whether its work
        waits for an agent slot."""
        label = status_label(session.status)
        return f"{label} (waiting for an agent slot)" if session.waiting_seq is not None else label

    @admin.action(description="Compact selected sessions")
    def compact_selected(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        for session in queryset[:50]:  # each one is a model call
            try:
                ok, text = compact_outcome(request.user, session.id)
            except (UnknownSession, NotAllowed):
                self.message_user(request, f"{session}: you may not compact it", messages.ERROR)
                continue
            self.message_user(request, f"{session}: {text}", messages.SUCCESS if ok else messages.WARNING)

    def _ids(self, queryset: QuerySet[Session]) -> list[str]:
        return [str(sid) for sid in queryset.values_list("id", flat=True)[:ACTION_LIMIT]]

    @admin.action(description="Suspend admission")
    def suspend_sessions(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        operate(
            self,
            request,
            self._ids(queryset),
            "Suspended admission for",
            lambda sid, by: operators.suspend("session", sid, by=by, reason=VIA_ADMIN),
        )

    @admin.action(description="Resume admission")
    def resume_sessions(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        operate(
            self,
            request,
            self._ids(queryset),
            "Resumed admission for",
            lambda sid, by: operators.resume("session", sid, by=by, reason=VIA_ADMIN),
        )

    @admin.action(description="Revoke")
    def revoke_sessions(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        operate(
            self,
            request,
            self._ids(queryset),
            "Revoked",
            lambda sid, by: operators.revoke(sid, by=by, reason=VIA_ADMIN),
        )

    @admin.action(description="Restore")
    def restore_sessions(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        operate(
            self,
            request,
            self._ids(queryset),
            "Restored",
            lambda sid, by: operators.restore(sid, by=by, reason=VIA_ADMIN),
        )

    @admin.action(description="Check usage totals against the log")
    def check_usage(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        for session in queryset[:50]:  # scans each log: an admin check, not a page view
            ok, running, summed = check_session(session.id)
            text = "totals match the log" if ok else f"MISMATCH: running {running} vs log {summed}"
            self.message_user(request, f"{session}: {text}", messages.SUCCESS if ok else messages.ERROR)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sessions are created through the app; the runtime spawns their agent


class EventKindFilter(admin.SimpleListFilter):
    """Kinds come from the catalogue: the default filter would run SELECT
    DISTINCT kind over the whole log on every page."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in CATALOGUE]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Event]) -> QuerySet[Event]:
        value = self.value()
        return queryset.filter(kind=value) if value else queryset


@admin.register(Event)
class EventAdmin(admin.ModelAdmin[Event]):
    """Read-only, paged view of the log. Sessions hold 100k+ events, so the
    change list never offers a full page, never counts the table twice, and
    pages in (session_id, seq) index order."""

    list_display = ["session", "seq", "kind", "created_at"]
    list_filter = [EventKindFilter]
    search_fields = ["=session__id"]
    list_per_page = 100
    list_max_show_all = 0
    show_full_result_count = False
    # session_id, not session: ordering by the relation would sort by
    # Session.Meta.ordering through a join, over the whole log, per page.
    ordering = ["session_id", "seq"]
    readonly_fields = ["session", "seq", "kind", "data", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    """Bearer tokens: listed by prefix, revoked here, created with
    `manage.py create_api_token` (the token is shown once there). The stored
    hash is never shown."""

    list_display = ["prefix", "name", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "user__username"]
    list_select_related = ["user"]
    fields = ["prefix", "name", "user", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "user", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke_tokens"]

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = revoke(queryset)
        self.message_user(request, f"Revoked {count} token(s).")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are issued by `manage.py create_api_token`, which shows the token once


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin[Schedule]):
    """Schedules, read-only: made through the session page, the API or the
    agent's tool (each logs schedule/created); cancelled with the action,
    which logs schedule/cancelled with the admin's name."""

    list_display = [
        "id",
        "session",
        "status",
        "due_at",
        "every_seconds",
        "cron",
        "runs",
        "max_runs",
        "expires_at",
        "created_by",
    ]
    list_filter = ["status", "misfire"]
    search_fields = ["reason", "text"]
    list_select_related = ["session"]
    actions = ["cancel_selected"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a deleted row would leave its schedule/created unanswered: cancel it

    @admin.action(description="Cancel selected schedules")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        by = request.user.get_username()
        done = 0
        for sid, session_id in list(queryset.values_list("id", "session_id")[:200]):
            try:
                schedules.cancel(session_id, sid, by=by, reason="cancelled in the admin")
            except TerretError as exc:
                self.message_user(request, f"{sid}: not cancelled: {exc}", messages.WARNING)
            else:
                done += 1
        if done:
            self.message_user(request, f"Cancelled {done} schedule(s).", messages.SUCCESS)


@admin.register(PersonNotifications)
class PersonNotificationsAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "email", "webhook_url")
    fields = ("user", "email", "webhook_url", "secret")
    readonly_fields = ("user", "webhook_url", "secret")

    @admin.display(description="webhook secret")
    def secret(self, obj: PersonNotifications) -> str:
        return notify_services.mask(obj.webhook_secret) or "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # made by the person on the settings page


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "name", "session", "seq", "recipient", "channel", "status", "attempts", "created_at")
    list_filter = ("status", "channel", "name")
    actions = ("send_again",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Notification._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Send again (unknown or failed only)")
    def send_again(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        count = outbox.requeue(list(queryset.values_list("id", flat=True)))
        messages.info(request, f"{count} notification(s) will be sent again.")
