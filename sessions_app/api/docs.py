"""The API's Swagger UI page (/api/docs) from django-ninja's own templates and
static files, with no CDN.

"ninja" is not an installed app: installing it imports ninja and pydantic in
every process at `django.setup()`, Celery workers included, where a fresh
worker's boot is recovery time (terret_site/worker.py). Its template and
static directories are on the search paths instead (settings.NINJA_DIR), and
ninja, which picks its CDN page unless "ninja" is installed, is told to render
the local one here.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from ninja.openapi.docs import Swagger

if TYPE_CHECKING:
    from ninja import NinjaAPI


class LocalSwagger(Swagger):
    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {
            "swagger_settings": json.dumps(self.settings, indent=1),
            "api": api,
            # The page sends the CSRF token when a cookie authenticates (api/auth.py, CookieAuth).
            "add_csrf": isinstance(api.auth, list | tuple) and any(getattr(a, "csrf", False) for a in api.auth),
        }
        return render(request, self.template, context)
