"""The JSON API (django-ninja). Thin: shape validation by the schemas, the
rules in sessions_app/actions/, and one error rendering for everything (sessions_app/errors.py).

OpenAPI 3.1 document: GET /api/openapi.json. Protocol notes: docs/protocol.md.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import Header, NinjaAPI, Query, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError

from sessions_app import actions
from sessions_app.api import listing
from sessions_app.api.auth import BearerAuth, CookieAuth
from sessions_app.api.docs import LocalSwagger
from sessions_app.api.schemas import (
    AttentionOut,
    BudgetIn,
    BudgetOut,
    CancelOut,
    CompactOut,
    CreatedOut,
    CreateSessionIn,
    DecisionIn,
    DecisionOut,
    DocumentContentOut,
    DocumentIn,
    DocumentOut,
    DocumentsOut,
    EditionOut,
    EditionResolveIn,
    EditionsOut,
    EffectsOut,
    ErrorOut,
    EventsOut,
    ForkErrorOut,
    ForkIn,
    ForkOut,
    InputIn,
    MonitorIn,
    MonitorOut,
    MonitorsOut,
    NotificationsIn,
    NotificationsOut,
    OpsOut,
    PolicyIn,
    PolicyOut,
    ProfilesOut,
    ProfileVersionsOut,
    ReasonIn,
    ReceiptOut,
    ResolveIn,
    ResolveOut,
    RetryOut,
    ScheduleIn,
    ScheduleOut,
    SchedulesOut,
    ScopeIn,
    SessionActionOut,
    SessionListOut,
    SessionOut,
    StorageIn,
    StorageOut,
    TaskOut,
    TasksOut,
    UpgradeIn,
    UpgradeRefusedOut,
    VersionOut,
    created_out,
    edition_out,
    effects_out,
    fork_out,
    monitor_out,
    profiles_out,
    resolved_out,
    schedule_out,
    schedules_out,
)
from sessions_app.api.schemas import Status as SessionStatus
from sessions_app.errors import (
    CsrfFailed,
    InvalidForkPoint,
    InvalidInput,
    InvalidJson,
    PathNotFound,
    PayloadTooLarge,
    TerretError,
    Unauthenticated,
    UpgradeRefused,
    as_error,
    error_body,
)

logger = logging.getLogger(__name__)

api = NinjaAPI(
    title="Terret API",
    version="1",
    description="Drive Terret sessions from programs. Frames of the session socket: docs/protocol.md.",
    urls_namespace="terret_api",
    docs_url="/docs",
    docs=LocalSwagger(),  # from ninja's own static files, no CDN
    auth=[BearerAuth(), CookieAuth()],
)

# Every operation documents the errors it can answer with; the schemathesis
# run checks the responses against this.
_READ_ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut}
_WRITE_ERRORS: dict[int, Any] = {**_READ_ERRORS, 409: ErrorOut, 413: ErrorOut, 429: ErrorOut}


# ---------------------------------------------------------------- errors


def _render(request: HttpRequest, exc: TerretError) -> HttpResponse:
    return api.create_response(request, error_body(exc), status=exc.status)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors[:5]:
        loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "payload", "query", "path", "header")]
        parts.append(f"{'.'.join(loc) or 'body'}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def _database_outage(request: HttpRequest, exc: Exception) -> HttpResponse:
    # Not ninja's (a 500, or a traceback with DEBUG on): terret_site/middleware.py
    # answers a database outage 503 with Retry-After, for pages and API alike.
    raise exc


@api.exception_handler(TerretError)
def _terret_error(request: HttpRequest, exc: TerretError) -> HttpResponse:
    return _render(request, exc)


@api.exception_handler(InvalidForkPoint)
def _invalid_fork_point(request: HttpRequest, exc: InvalidForkPoint) -> HttpResponse:
    # The nearest fork points as fields too, so a program can retry at one.
    body = {**error_body(exc), "before": exc.before, "after": exc.after}
    return api.create_response(request, body, status=exc.status)


@api.exception_handler(UpgradeRefused)
def _upgrade_refused(request: HttpRequest, exc: UpgradeRefused) -> HttpResponse:
    return api.create_response(request, {**error_body(exc), "reasons": exc.reasons}, status=exc.status)


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return _render(request, InvalidInput(_validation_message(exc)))


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if isinstance(exc, AuthenticationError) or exc.status_code == 401:
        return _render(request, Unauthenticated("send Authorization: Bearer <token>, or sign in"))
    if exc.status_code == 400 and "parse request body" in exc.message:
        return _render(request, InvalidJson("the request body is not valid JSON"))
    if exc.status_code == 403:
        return _render(request, CsrfFailed(exc.message))
    error = TerretError(exc.message)
    error.status = exc.status_code
    return _render(request, error)


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _render(request, PathNotFound("no such API path"))


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return _render(request, PayloadTooLarge("the request body is too large"))


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    error = as_error(exc)
    if error.status >= 500:
        logger.exception("API %s %s failed", request.method, request.path)
    return _render(request, error)


@csrf_exempt  # it changes nothing: a token POST to a wrong path gets this 404, not the CSRF page
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Any other path under /api/: JSON, like the rest of the API."""
    return JsonResponse(error_body(PathNotFound(f"no API path {request.path[:200]}")), status=404)


# ---------------------------------------------------------------- routes


def _user(request: HttpRequest) -> Any:
    return request.auth  # type: ignore[attr-defined]


@api.get("/profiles", response={200: ProfilesOut, **_READ_ERRORS}, tags=["profiles"])
def list_profiles(request: HttpRequest) -> Any:
    """The agent profiles the caller may start sessions with."""
    return profiles_out(actions.list_profiles(_user(request)))


@api.get("/profiles/{name}/versions", response={200: ProfileVersionsOut, **_READ_ERRORS}, tags=["profiles"])
def profile_versions(request: HttpRequest, name: str) -> Any:
    """The profile's agent versions, newest first, with how many sessions run on each."""
    return {"versions": [v.as_json() for v in actions.profile_versions(_user(request), name)]}


@api.post(
    "/sessions",
    response={201: CreatedOut, **_WRITE_ERRORS},
    tags=["sessions"],
    operation_id="sessions_app_api_views_create_session",  # its name before the view was renamed
)
def sessions_create(request: HttpRequest, payload: CreateSessionIn) -> Any:
    """Start a session from a profile (its agent is spawned by its first input)."""
    return Status(201, created_out(actions.create_session(_user(request), payload.profile)))


@api.get("/sessions", response={200: SessionListOut, **_READ_ERRORS}, tags=["sessions"])
def list_sessions(
    request: HttpRequest,
    limit: int = Query(listing.DEFAULT_LIMIT, ge=1, le=listing.MAX_LIMIT),
    cursor: str | None = Query(None, max_length=200),
    status: SessionStatus | None = Query(None),
    archived: Literal["false", "true", "all"] = Query("false"),
) -> Any:
    """The sessions you may read (your own; staff and reviewers: all), newest
    first, `limit` per page (1-200). Follow `next_cursor` for the next page.
    `status` keeps one status; `archived`: false (default, as the web list),
    true (archived only) or all."""
    return listing.list_sessions(_user(request), limit=limit, cursor=cursor, status=status, archived=archived)


@api.get("/sessions/{session_id}", response={200: SessionOut, **_READ_ERRORS}, tags=["sessions"])
def session_detail(request: HttpRequest, session_id: str) -> Any:
    """Status (with why it is blocked, or waiting for an agent slot), title,
    usage, log head and the calls waiting for approval."""
    return actions.session_detail(_user(request), session_id).as_json()


@api.post("/sessions/{session_id}/inputs", response={202: ReceiptOut, **_WRITE_ERRORS}, tags=["sessions"])
def post_input(
    request: HttpRequest,
    session_id: str,
    payload: InputIn,
    idempotency_key: str | None = Header(
        None, alias="Idempotency-Key", min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$"
    ),
) -> Any:
    """Send input. The receipt says whether it started a turn or was queued
    for the running one. Same Idempotency-Key and payload: the original
    receipt (replayed=true); same key, other payload: 409."""
    receipt = actions.inject(
        _user(request),
        session_id,
        payload.text,
        payload.wake,
        idempotency_key,
        lane=payload.lane,
        multitask_strategy=payload.multitask_strategy,
    )
    return Status(202, receipt.as_json())


@api.get("/sessions/{session_id}/inputs/{seq}", response={200: ReceiptOut, **_READ_ERRORS}, tags=["sessions"])
def get_input(request: HttpRequest, session_id: str, seq: int) -> Any:
    """An input's receipt with its current disposition: queued, held, placed
    (placed_seq), answered (answered_seq: the turn/end) or withdrawn."""
    return actions.input_receipt(_user(request), session_id, seq).as_json()


@api.post(
    "/sessions/{session_id}/inputs/{seq}/withdraw", response={200: ReceiptOut, **_WRITE_ERRORS}, tags=["sessions"]
)
def withdraw_input(request: HttpRequest, session_id: str, seq: int) -> Any:
    """Take back input no turn has taken in yet (an input/withdrawn event).
    Input already placed in the transcript: 409 input_consumed."""
    return actions.withdraw(_user(request), session_id, seq).as_json()


@api.get("/sessions/{session_id}/schedules", response={200: SchedulesOut, **_READ_ERRORS}, tags=["schedules"])
def list_schedules(request: HttpRequest, session_id: str) -> Any:
    """The session's schedules, newest first: status, runs, next_due_at, last_outcome."""
    return schedules_out(actions.list_schedules(_user(request), session_id))


@api.post(
    "/sessions/{session_id}/schedules",
    response={200: ScheduleOut, 201: ScheduleOut, 422: ErrorOut, **_WRITE_ERRORS},
    tags=["schedules"],
)
def create_schedule(request: HttpRequest, session_id: str, payload: ScheduleIn) -> Any:
    """Schedule a wake-up: at due_at, or every_seconds, or on a cron
    expression (UTC). When it fires, `text` arrives as a follow-up input.
    The profile bounds how many a session holds and the shortest interval
    (422 schedule_limit). The same idempotency_key and request answers the
    schedule made before (200); a new one is 201."""
    made, new = actions.create_schedule(_user(request), session_id, payload.model_dump(exclude_none=True))
    return Status(201 if new else 200, schedule_out(made))


@api.delete(
    "/sessions/{session_id}/schedules/{schedule_id}", response={200: ScheduleOut, **_WRITE_ERRORS}, tags=["schedules"]
)
def cancel_schedule(request: HttpRequest, session_id: str, schedule_id: str) -> Any:
    """Cancel a pending or paused schedule (a schedule/cancelled event)."""
    return schedule_out(actions.cancel_schedule(_user(request), session_id, schedule_id))


@api.get("/sessions/{session_id}/monitors", response={200: MonitorsOut, **_READ_ERRORS}, tags=["monitors"])
def list_monitors(request: HttpRequest, session_id: str) -> Any:
    """The session's monitors, newest first, each with its coverage per source partition."""
    return {"monitors": [monitor_out(m) for m in actions.list_monitors(_user(request), session_id)]}


@api.post(
    "/sessions/{session_id}/monitors",
    response={200: MonitorOut, 201: MonitorOut, 422: ErrorOut, **_WRITE_ERRORS},
    tags=["monitors"],
)
def create_monitor(request: HttpRequest, session_id: str, payload: MonitorIn) -> Any:
    """A monitor: on its schedule the host scans the sources (coverage per
    partition, from each one's checkpoint) and publishes an edition to the
    destination, each item version delivered once (docs/protocol.md,
    Monitors). 201 with the webhook's signing secret, shown this once; the
    same idempotency_key and request answers the monitor made before (200)."""
    made, new = actions.create_monitor(_user(request), session_id, payload.model_dump(exclude_none=True))
    return Status(201 if new else 200, monitor_out(made, secret=new))


@api.get("/monitors/{monitor_id}", response={200: MonitorOut, **_READ_ERRORS}, tags=["monitors"])
def get_monitor(request: HttpRequest, monitor_id: str) -> Any:
    """The monitor, `coverage` per source and partition (the last scan), and `next_due_at`."""
    return monitor_out(actions.monitor(_user(request), monitor_id))


@api.get("/monitors/{monitor_id}/editions", response={200: EditionsOut, **_READ_ERRORS}, tags=["monitors"])
def list_editions(request: HttpRequest, monitor_id: str, limit: int = Query(50, ge=1, le=200)) -> Any:
    """The monitor's editions, newest period first: status, items, scans, receipt and reason."""
    return {"editions": [edition_out(e) for e in actions.monitor_editions(_user(request), monitor_id, limit=limit)]}


@api.delete("/monitors/{monitor_id}", response={200: MonitorOut, **_WRITE_ERRORS}, tags=["monitors"])
def cancel_monitor(request: HttpRequest, monitor_id: str) -> Any:
    """Cancel the monitor: no more periods. Its editions and ledger stay."""
    return monitor_out(actions.cancel_monitor(_user(request), monitor_id))


@api.post(
    "/monitors/{monitor_id}/editions/{edition_id}/resolve",
    response={200: EditionOut, **_WRITE_ERRORS},
    tags=["monitors"],
)
def resolve_edition(request: HttpRequest, monitor_id: str, edition_id: str, payload: EditionResolveIn) -> Any:
    """The effect resolution of an edition's send of unknown outcome, reached by the edition (an alias
    of POST /api/sessions/{id}/effects/edition-{edition_id}/resolve, same rule): `done` with the receipt
    the destination shows, `failed` (its items go back to pending), or `rerun` (sent again under the same
    Idempotency-Key)."""
    e = actions.resolve_edition(
        _user(request), monitor_id, edition_id, payload.action, payload.receipt or "", payload.reason or ""
    )
    return edition_out(e)


@api.get("/sessions/{session_id}/tasks", response={200: TasksOut, **_READ_ERRORS}, tags=["tasks"])
def list_tasks(request: HttpRequest, session_id: str) -> Any:
    """The session's owned tasks, newest first (at most 200): kind, phase, age, output tail or child, outcome."""
    return {"tasks": [actions.task_json(t) for t in actions.list_tasks(_user(request), session_id)]}


@api.get("/tasks/{task_id}", response={200: TaskOut, **_READ_ERRORS}, tags=["tasks"])
def task_detail(request: HttpRequest, task_id: str) -> Any:
    """One task, as visible as its owning session (404 unknown_task otherwise)."""
    return actions.task_json(actions.task_detail(_user(request), task_id))


@api.post("/tasks/{task_id}/cancel", response={200: TaskOut, **_WRITE_ERRORS}, tags=["tasks"])
def cancel_task(request: HttpRequest, task_id: str) -> Any:
    """Cancel a live task: its abort intent is committed first (`aborting`),
    then its process group is killed (a subagent's turns and tasks are
    cancelled) and it settles with a task/cancelled receipt. A settled task
    is answered as it is."""
    return actions.task_json(actions.cancel_task(_user(request), task_id))


@api.get("/sessions/{session_id}/events", response={200: EventsOut, **_READ_ERRORS}, tags=["events"])
def list_events(
    request: HttpRequest,
    session_id: str,
    after: int = Query(0, ge=0),
    limit: int = Query(500, ge=1, le=1000),
) -> Any:
    """Events with seq > after, in order, at most `limit` (1-1000)."""
    return actions.events(_user(request), session_id, after, limit).as_json()


@api.post(
    "/sessions/{session_id}/approvals/{call_id}", response={200: DecisionOut, **_WRITE_ERRORS}, tags=["approvals"]
)
def decide(request: HttpRequest, session_id: str, call_id: str, payload: DecisionIn) -> Any:
    """Approve or deny a call parked in the open turn (reviewers). An approval
    may carry `edited_args` (run instead of the model's arguments) and
    `allow_for_session` (the tool stops asking for the rest of the session)."""
    decided = actions.decide(
        _user(request),
        session_id,
        call_id,
        payload.verdict,
        payload.reason,
        payload.request_seq,
        edited_args=payload.edited_args,
        allow_for_session=payload.allow_for_session,
    )
    return decided.as_json()


@api.put("/sessions/{session_id}/policy", response={200: PolicyOut, **_WRITE_ERRORS}, tags=["sessions"])
def set_policy(request: HttpRequest, session_id: str, payload: PolicyIn) -> Any:
    """Replace the session's allow-list patterns."""
    return actions.set_policy(_user(request), session_id, payload.patterns).as_json()


@api.post("/sessions/{session_id}/cancel", response={200: CancelOut, **_WRITE_ERRORS}, tags=["sessions"])
def cancel(request: HttpRequest, session_id: str) -> Any:
    """Cancel the open turn (cancelled=false when none was open). A turn no
    worker holds (parked, blocked, not yet claimed) ends at once (closed=true);
    a running one stops its model stream within about a second."""
    return actions.cancel(_user(request), session_id).as_json()


@api.post("/sessions/{session_id}/retry", response={202: RetryOut, **_WRITE_ERRORS}, tags=["sessions"])
def retry(request: HttpRequest, session_id: str) -> Any:
    """Drive a blocked turn again now (409 not_blocked when it is not blocked)."""
    return Status(202, actions.retry(_user(request), session_id).as_json())


@api.post(
    "/sessions/{session_id}/upgrade",
    response={200: VersionOut, **_WRITE_ERRORS, 409: UpgradeRefusedOut},
    tags=["sessions"],
)
def upgrade(request: HttpRequest, session_id: str, payload: UpgradeIn) -> Any:
    """Move the session to another version of its profile (owner or staff); 409 upgrade_refused with
    `reasons` when it would strand an owed call or a pending approval, and then nothing changes."""
    return actions.upgrade(_user(request), session_id, payload.to).as_json()


@api.get("/sessions/{session_id}/effects", response={200: EffectsOut, **_READ_ERRORS}, tags=["effects"])
def list_effects(request: HttpRequest, session_id: str) -> Any:
    """The effect ledger: every attempt of a tool call that is not inline, oldest
    first, with its state; `pending` counts those of unknown outcome."""
    return effects_out(actions.effects(_user(request), session_id))


@api.post(
    "/sessions/{session_id}/effects/{call_id}/resolve",
    response={200: ResolveOut, **_WRITE_ERRORS},
    tags=["effects"],
)
def resolve_effect(request: HttpRequest, session_id: str, call_id: str, payload: ResolveIn) -> Any:
    """Answer the newest attempt of unknown outcome of a call (staff; the owner
    with TERRET_OWNER_MAY_RESOLVE on): run it again, or record it done or
    failed. 404 unknown_effect: no attempt of that call; 409
    effect_not_pending: none of unknown outcome, or a rerun of an ended turn."""
    return resolved_out(
        actions.resolve(_user(request), session_id, call_id, payload.action, payload.result, payload.reason)
    )


@api.get("/sessions/{session_id}/budget", response={200: BudgetOut, **_READ_ERRORS}, tags=["budgets"])
def get_budget(request: HttpRequest, session_id: str) -> Any:
    """The session's limits and spend, and the first budget at any scope
    (session; the profile's or the installation's UTC day) that keeps a new
    turn from starting (`exhausted`, null when none does)."""
    return actions.budget(_user(request), session_id).as_json()


@api.put("/sessions/{session_id}/budget", response={200: BudgetOut, **_WRITE_ERRORS}, tags=["budgets"])
def set_budget(request: HttpRequest, session_id: str, payload: BudgetIn) -> Any:
    """Replace the session's four limits (all four required; null: no
    limit); the budget as GET answers it afterwards. Held input runs once
    the budgets allow it. The owner or staff."""
    return actions.set_budget(_user(request), session_id, payload.model_dump()).as_json()


@api.post(
    "/sessions/{session_id}/compact", response={200: CompactOut, **_WRITE_ERRORS, 502: ErrorOut}, tags=["sessions"]
)
def compact(request: HttpRequest, session_id: str) -> Any:
    """Summarise the history now (between turns)."""
    return actions.compact(_user(request), session_id).as_json()


@api.post(
    "/sessions/{session_id}/fork",
    response={201: ForkOut, **_WRITE_ERRORS, 422: ForkErrorOut},
    tags=["sessions"],
)
def fork(request: HttpRequest, session_id: str, payload: ForkIn) -> Any:
    """A new session of the caller's from this one's log as of `at_seq` (who
    may read a session may fork it). 422 invalid_fork_point: at_seq is no fork
    point (inside a step, past the head, inside a fork's seed); `before` and
    `after` name the nearest ones."""
    return Status(201, fork_out(actions.fork(_user(request), session_id, payload.at_seq, payload.policy)))


# ---------------------------------------------------------------- documents


@api.get(
    "/sessions/{session_id}/documents", response={200: DocumentsOut, **_READ_ERRORS}, tags=["documents"], by_alias=True
)
def documents(request: HttpRequest, session_id: str) -> Any:
    """The session's documents (its workspace among them), each at its head:
    name, kind, scope, version, size and incarnation."""
    return actions.documents(_user(request), session_id).as_json()


@api.get(
    "/sessions/{session_id}/documents/{path:name}",
    response={200: DocumentContentOut, **_READ_ERRORS},
    tags=["documents"],
    by_alias=True,
)
def document(request: HttpRequest, session_id: str, name: str, version: int | None = None) -> Any:
    """A document's content: its head, or `version` of its live incarnation
    (404 unknown_document when there is none)."""
    return actions.document(_user(request), session_id, name, version).as_json()


@api.put(
    "/sessions/{session_id}/documents/{path:name}",
    response={200: DocumentOut, **_WRITE_ERRORS, 422: ErrorOut},
    tags=["documents"],
    by_alias=True,
)
def write_document(request: HttpRequest, session_id: str, name: str, payload: DocumentIn) -> Any:
    """Write a document as the session's owner (or staff): its next version,
    a durable write logged as document/written. 413 document_too_large past a
    profile's bound; 409 document_conflict when `incarnation` (and `version`)
    are no longer the document's; 422 document_version_unsupported for a
    schema version newer than the server's."""
    return actions.write_document(_user(request), session_id, name, payload.model_dump(by_alias=True))


# ---------------------------------------------------------------- operators (staff only)


@api.get("/ops/attention", response={200: AttentionOut, **_READ_ERRORS}, tags=["operators"])
def ops_attention(request: HttpRequest) -> Any:
    """What needs a human, by kind, each bounded, with counts (staff only)."""
    return actions.attention(_user(request)).as_json()


@api.post("/sessions/{session_id}/storage", response={200: StorageOut, **_WRITE_ERRORS}, tags=["operators"])
def set_storage(request: HttpRequest, session_id: str, payload: StorageIn) -> Any:
    """Move the session's events cold (a compressed archive; the next touch reads them back) or hot now
    (staff only; logged as storage/cold or storage/hot with the actor). 409 storage_busy: a turn is open,
    a call waits for a decision, or input waits."""
    return actions.set_storage(_user(request), session_id, payload.tier)


@api.post("/ops/suspend", response={200: OpsOut, **_WRITE_ERRORS}, tags=["operators"])
def ops_suspend(request: HttpRequest, payload: ScopeIn) -> Any:
    """Suspend admission for everything, one profile or one session: new input
    is held, and a running turn parks at its next step boundary (staff only)."""
    return actions.suspend(_user(request), payload.scope, payload.target, payload.reason).as_json()


@api.post("/ops/resume", response={200: OpsOut, **_WRITE_ERRORS}, tags=["operators"])
def ops_resume(request: HttpRequest, payload: ScopeIn) -> Any:
    """Lift a suspension; the sessions it held are woken (staff only)."""
    return actions.resume(_user(request), payload.scope, payload.target, payload.reason).as_json()


@api.post("/sessions/{session_id}/abandon", response={200: SessionActionOut, **_WRITE_ERRORS}, tags=["operators"])
def abandon(request: HttpRequest, session_id: str, payload: ReasonIn) -> Any:
    """Close the blocked turn failed (409 not_abandonable when none is blocked,
    or a worker holds it) (staff only)."""
    return actions.session_action(_user(request), session_id, "abandon", payload.reason).as_json()


@api.post("/sessions/{session_id}/revoke", response={200: SessionActionOut, **_WRITE_ERRORS}, tags=["operators"])
def revoke(request: HttpRequest, session_id: str, payload: ReasonIn) -> Any:
    """Cancel the open turn, deny every tool call and refuse input until restored (staff only)."""
    return actions.session_action(_user(request), session_id, "revoke", payload.reason).as_json()


@api.post("/sessions/{session_id}/restore", response={200: SessionActionOut, **_WRITE_ERRORS}, tags=["operators"])
def restore(request: HttpRequest, session_id: str, payload: ReasonIn) -> Any:
    """Lift a revocation: the session takes input again (staff only)."""
    return actions.session_action(_user(request), session_id, "restore", payload.reason).as_json()


# ---------------------------------------------------------------- the signed-in person


@api.get("/me/notifications", response={200: NotificationsOut, **_READ_ERRORS}, tags=["me"])
def my_notifications(request: HttpRequest) -> Any:
    """How you are told when something needs you (docs/notifications.md); the secret is shown masked."""
    return actions.notification_settings(_user(request)).as_json()


@api.put("/me/notifications", response={200: NotificationsOut, **_WRITE_ERRORS}, tags=["me"])
def set_my_notifications(request: HttpRequest, payload: NotificationsIn) -> Any:
    """Change how you are told: a field left out is kept; a webhook URL is checked against
    server-side request forgery (400 unsafe_url) and needs a secret."""
    values = payload.model_dump(exclude_unset=True)
    if values.get("webhook_secret") is None:
        values.pop("webhook_secret", None)
    if "email" in values and values["email"] is None:
        values.pop("email")
    return actions.set_notification_settings(_user(request), values).as_json()
