"""Session pages. Mounted at the site root (terret_site/urls.py)."""

from __future__ import annotations

from django.urls import URLPattern, path

from sessions_app.web import console
from sessions_app.web import sessions as views

app_name = "sessions"

urlpatterns: list[URLPattern] = [
    path("", views.session_list, name="list"),
    path("sessions/new/", views.session_new, name="new"),
    path("sessions/<uuid:session_id>/", views.session_chat, name="chat"),
    path("sessions/<uuid:session_id>/messages/", views.session_message, name="message"),
    path("sessions/<uuid:session_id>/cancel/", views.session_cancel, name="cancel"),
    path("sessions/<uuid:session_id>/retry/", views.session_retry, name="retry"),
    path("sessions/<uuid:session_id>/effects/resolve/", views.session_resolve, name="resolve"),
    path("sessions/<uuid:session_id>/budget/", views.session_budget, name="budget"),
    path("ops/", console.index, name="console"),
    path("ops/suspend/", console.suspend, name="console_suspend"),
    path("ops/resume/", console.resume, name="console_resume"),
    path(
        "ops/sessions/<uuid:session_id>/<slug:action>/",
        console.session_action,
        name="console_session_action",
    ),
]
