from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from terret_site.metrics import metrics_view

# The admin's modules register here, with the URLs, not at `django.setup()`
# (SimpleAdminConfig, terret_site/settings.py): workers never load them.
admin.autodiscover()

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("sessions_app.api.urls")),
    path("lg/", include("sessions_app.lg.urls")),  # the LangGraph-compatible door (docs/langgraph.md)
    path("approvals/", include("approvals_app.urls")),
    path("", include("policies_app.urls")),
    path("", include("sessions_app.web.urls")),
    path("", include("sessions_app.web.dashboard_urls")),
]

# Styled error pages (JSON under /api/); a plain 403 is answered without a traceback
# (sessions_app.web.errors.QuietForbiddenMiddleware).
handler403 = "sessions_app.web.errors.forbidden"
handler404 = "sessions_app.web.errors.not_found"
