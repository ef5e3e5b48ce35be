"""The floor under every door: one function per thing a user can do.

Every door (the pages in web/, the JSON API in api/, the session socket in
sockets/, the LangGraph-compatible /lg/, the approvals and policies pages)
calls the same verb with the authenticated user, and the verb asks the one
access rule first (`access.session_for(user, session_id, need)`):

- a missing or unreadable session is `UnknownSession` (404 on every door),
- a readable one the user may not do `need` to is `NotAllowed` (403),

then calls one service. Doors only validate the shape of a request and
render the answer (api/schemas.py, lg/mapping.py, the socket's frames, the
templates); no door decides who may do what, and no door imports another.

Verbs return domain values, which each door shapes: a Session
(create_session, fork, edit_and_resend, regenerate, archive, unarchive), a
Receipt (inject, input_receipt, withdraw), Schedule rows, the ledger's
Effects and `Resolved`, a `Decision`, AgentProfile rows (list_profiles), a
SessionDetail, an EventsPage, a document Listing or Read, `Cancelled`, `StatusAfter` (retry, the
operators' session actions), a `Compaction`, a `ModelRole`, a `Policy`, a
`Budget`, `Attention` and `ScopeChange`. Each value's `as_json()` is its
one JSON shape, shared by the API (whose schemas.py declares it) and the
socket's acks, as the protocol is one for both.

Verbs, by noun (`verb(user, session_id, ...)`):

- sessions.py: list_profiles, create_session, session_detail, set_storage (staff), events,
  socket_access, cancel, retry, compact, set_model, rename, archive,
  unarchive (and health, live_state, head for a socket that was let in
  already)
- inputs.py: inject, input_receipt, withdraw
- schedules.py: list_schedules, create_schedule, cancel_schedule
- monitors.py: list_monitors, create_monitor, monitor, monitor_editions,
  cancel_monitor, resolve_edition
- tasks.py: list_tasks, task_detail, cancel_task (owned work; task_json shapes a Task)
- approvals.py: decide
- policies.py: set_policy, ask_again
- effects.py: effects, resolve
- budgets.py: budget, set_budget (budget_state)
- forks.py: fork, edit_and_resend, regenerate
- documents.py: documents, document (view), write_document (drive)
- operators.py: attention, suspend, resume, session_action (staff: retry,
  abandon, revoke, restore); the live fleet view: fleet (running now, the
  session table), decide_approval (the reviewers' verb, logged with its
  actor), free_held, timeline
- notifications.py: notification_settings, set_notification_settings (the
  signed-in person's own; no session)
- files.py: workspace_files (the chat page's files panel: the one selector
  that lists a session's files, with version and last writer), workspace_file
  (one version of a file for its page), upload_limit (the panel's uploads
  write through write_document)
- versions.py: upgrade (owner or staff, through the pre-flight),
  profile_versions, upgrade_profile (operators: a profile's sessions in bulk),
  session_version and newest_version (for a socket or /lg/ that let the reader in)

The needs are view, drive, approve, resolve and operate (access.py;
sessions_app/permissions.py says who has each).
"""

from __future__ import annotations

from sessions_app.actions.access import (
    Need,
    allowed,
    by,
    operator,
    parse_session_id,
    reviewer,
    reviews,
    sees_all,
    session_for,
    visible,
)
from sessions_app.actions.approvals import Decision, decide
from sessions_app.actions.budgets import budget, budget_state, set_budget
from sessions_app.actions.documents import document, documents, write_document
from sessions_app.actions.effects import Resolved, effects, resolve
from sessions_app.actions.forks import edit_and_resend, fork, regenerate
from sessions_app.actions.inputs import inject, input_receipt, withdraw
from sessions_app.actions.monitors import (
    cancel_monitor,
    create_monitor,
    list_monitors,
    monitor,
    monitor_editions,
    resolve_edition,
)
from sessions_app.actions.notifications import notification_settings, set_notification_settings
from sessions_app.actions.operators import (
    SESSION_ACTIONS,
    attention,
    decide_approval,
    fleet,
    free_held,
    resume,
    session_action,
    suspend,
    timeline,
)
from sessions_app.actions.policies import ask_again, set_policy
from sessions_app.actions.schedules import cancel_schedule, create_schedule, list_schedules
from sessions_app.actions.sessions import (
    archive,
    cancel,
    chat_rows,
    compact,
    create_session,
    events,
    head,
    health,
    list_profiles,
    live_state,
    rename,
    retry,
    session_detail,
    set_model,
    set_storage,
    socket_access,
    unarchive,
    usable_profiles,
)
from sessions_app.actions.tasks import cancel_task, list_tasks, session_parent, task_detail, task_json
from sessions_app.actions.versions import (
    newest_version,
    profile_versions,
    session_version,
    upgrade,
    upgrade_profile,
)

__all__ = [
    "SESSION_ACTIONS",
    "Decision",
    "Need",
    "Resolved",
    "allowed",
    "archive",
    "ask_again",
    "attention",
    "budget",
    "budget_state",
    "by",
    "cancel",
    "cancel_monitor",
    "cancel_schedule",
    "cancel_task",
    "chat_rows",
    "compact",
    "create_monitor",
    "create_schedule",
    "create_session",
    "decide",
    "decide_approval",
    "document",
    "documents",
    "edit_and_resend",
    "effects",
    "events",
    "fleet",
    "fork",
    "free_held",
    "head",
    "health",
    "inject",
    "input_receipt",
    "list_monitors",
    "list_profiles",
    "list_schedules",
    "list_tasks",
    "live_state",
    "monitor",
    "monitor_editions",
    "newest_version",
    "notification_settings",
    "operator",
    "parse_session_id",
    "profile_versions",
    "regenerate",
    "rename",
    "resolve",
    "resolve_edition",
    "resume",
    "retry",
    "reviewer",
    "reviews",
    "sees_all",
    "session_action",
    "session_detail",
    "session_for",
    "session_parent",
    "session_version",
    "set_budget",
    "set_model",
    "set_notification_settings",
    "set_policy",
    "set_storage",
    "socket_access",
    "suspend",
    "task_detail",
    "task_json",
    "timeline",
    "unarchive",
    "upgrade",
    "upgrade_profile",
    "usable_profiles",
    "visible",
    "withdraw",
    "write_document",
]
