"""Mounted at /lg/ by terret_site/urls.py: clients use url="http://host/lg"."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path, re_path

from sessions_app.lg import views

T = "threads/<str:thread_id>"
R = T + "/runs/<str:run_id>"

urlpatterns: list[URLPattern | URLResolver] = [
    path("info", views.info),
    path("assistants/search", views.assistants_search),
    path("assistants/<str:assistant_id>", views.assistant_detail),
    path("threads", views.threads_create),
    path("threads/search", views.threads_search),
    path(T, views.thread_detail),
    path(T + "/state", views.thread_state),
    path(T + "/state/<str:checkpoint>", views.thread_state_at),
    path(T + "/history", views.thread_history),
    path(T + "/runs", views.runs),
    path(T + "/runs/stream", views.runs_stream),
    path(T + "/runs/wait", views.runs_wait),
    path(R, views.run_detail),
    path(R + "/stream", views.run_stream),
    path(R + "/join", views.run_join),
    path(R + "/cancel", views.run_cancel),
    # Anything else under /lg/ answers in JSON too.
    re_path(r"", views.not_found),
]
