"""Mounted at /api/ by terret_site/urls.py."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path, re_path

from sessions_app.api.views import api, not_found

urlpatterns: list[URLPattern | URLResolver] = [
    path("", api.urls),
    # Anything else under /api/ answers in JSON too (not the HTML 404 page).
    re_path(r"", not_found),
]
