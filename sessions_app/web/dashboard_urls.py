"""Dashboard and compaction routes. Mounted at the site root (terret_site/urls.py)."""

from __future__ import annotations

from django.urls import URLPattern, path

from sessions_app.web import dashboard as dashboard_views

app_name = "dashboard"

urlpatterns: list[URLPattern] = [
    path("dashboard/", dashboard_views.dashboard, name="index"),
    path("sessions/<uuid:session_id>/compact/", dashboard_views.compact, name="compact"),
]
