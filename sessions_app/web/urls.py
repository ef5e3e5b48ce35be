"""Session pages. Mounted at the site root (terret_site/urls.py)."""

from __future__ import annotations

from django.urls import URLPattern, path

from sessions_app.web import account, console
from sessions_app.web import files as file_views
from sessions_app.web import forks as fork_views
from sessions_app.web import schedules as schedule_views
from sessions_app.web import sessions as views

app_name = "sessions"

urlpatterns: list[URLPattern] = [
    path("", views.session_list, name="list"),
    path("sessions/new/", views.session_new, name="new"),
    path("sessions/<uuid:session_id>/", views.session_chat, name="chat"),
    path("sessions/<uuid:session_id>/messages/", views.session_message, name="message"),
    path("sessions/<uuid:session_id>/cancel/", views.session_cancel, name="cancel"),
    path("tasks/<uuid:task_id>/cancel/", views.task_cancel, name="task_cancel"),
    path("sessions/<uuid:session_id>/retry/", views.session_retry, name="retry"),
    path("sessions/<uuid:session_id>/effects/resolve/", views.session_resolve, name="resolve"),
    path("sessions/<uuid:session_id>/budget/", views.session_budget, name="budget"),
    path("sessions/<uuid:session_id>/schedules/", schedule_views.create, name="schedule_create"),
    path(
        "sessions/<uuid:session_id>/schedules/<uuid:schedule_id>/cancel/",
        schedule_views.cancel,
        name="schedule_cancel",
    ),
    path("sessions/<uuid:session_id>/rename/", views.session_rename, name="rename"),
    path("sessions/<uuid:session_id>/archive/", views.session_archive, name="archive"),
    path("sessions/<uuid:session_id>/unarchive/", views.session_unarchive, name="unarchive"),
    path("sessions/<uuid:session_id>/context/", views.session_context, name="context"),
    path("sessions/<uuid:session_id>/model/", views.session_model, name="model"),
    *fork_views.urlpatterns,  # edit-and-resend, regenerate and the fork panel (web/forks.py)
    *file_views.urlpatterns,  # the files panel: a file's page, its download, an upload (web/files.py)
    path("settings/", account.settings_page, name="settings"),
    path("settings/tokens/", account.token_create, name="token_create"),
    path("settings/notifications/", account.notifications_save, name="notifications_save"),
    path("settings/tokens/<int:token_id>/revoke/", account.token_revoke, name="token_revoke"),
    path("ops/", console.index, name="console"),
    path("ops/suspend/", console.suspend, name="console_suspend"),
    path("ops/resume/", console.resume, name="console_resume"),
    path("ops/sessions/<uuid:session_id>/decide/", console.decide, name="console_decide"),
    path("ops/sessions/<uuid:session_id>/timeline/", console.timeline, name="console_timeline"),
    path(
        "ops/sessions/<uuid:session_id>/<slug:action>/",
        console.session_action,
        name="console_session_action",
    ),
]
