"""Mounted at the site root (terret_site/urls.py)."""

from __future__ import annotations

from django.urls import URLPattern, path

from policies_app import views

app_name = "policies"

urlpatterns: list[URLPattern] = [
    path("sessions/<uuid:session_id>/policy/", views.editor, name="editor"),
]
