"""Mounted at /approvals/ (terret_site/urls.py)."""

from __future__ import annotations

from django.urls import URLPattern, path

from approvals_app import views

app_name = "approvals"

urlpatterns: list[URLPattern] = [
    path("", views.queue_page, name="queue"),
    path("queue/", views.queue_fragment, name="queue_fragment"),
    path("sessions/<uuid:session_id>/", views.inline_fragment, name="inline"),
    path("sessions/<uuid:session_id>/decide/", views.decide, name="decide"),
]
