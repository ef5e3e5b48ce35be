"""Styled 403 and 404 pages, and a quiet 403.

Django logs every PermissionDenied that reaches its handler with the
exception attached, so each refused page view (a reviewer-less user opening
the queue, a reviewer posting a message) wrote a traceback. A refusal is not
a fault: the middleware answers it with the styled page itself, and the only
log line is Django's one-line "Forbidden: /path" warning. Paths under /api/
are left to the API, which answers in JSON.

The access rule's two refusals (sessions_app.actions.access) become pages
here too, so no view converts them itself: `UnknownSession` is the styled
404 (a foreign id and a missing one look alike), `NotAllowed` the 403; a
file the files panel names that does not exist (`UnknownDocument`) is the
404 too.

With DEBUG on, Django answers a path no URL matches (a malformed session id,
say) with its technical 404, which lists every URL pattern: a person
following a stale link gets the styled page instead (issue 34).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from sessions_app.errors import NotAllowed, UnknownDocument, UnknownSession, UnknownTask

API_PREFIX = "/api/"
# What only Django's technical 404 page says (django/views/templates/technical_404.html).
TECHNICAL_404_MARK = b"DEBUG = True</code>"


def _message(exception: BaseException | None, default: str) -> str:
    text = str(exception or "").strip()
    # Django's own resolver messages (a dict, the tried patterns) are not for users.
    return text if text and not text.startswith("{") and len(text) < 300 else default


def forbidden(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    reason = _message(exception, "You do not have permission to do that.")
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"code": "not_allowed", "message": reason}, status=403)
    return render(request, "errors/403.html", {"reason": reason}, status=403)


def not_found(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"code": "not_found", "message": f"no such path: {request.path}"}, status=404)
    return render(request, "errors/404.html", {"path": request.path}, status=404)


class QuietForbiddenMiddleware:
    """Answers a view's PermissionDenied or NotAllowed with the styled 403,
    unlogged, and its UnknownSession (UnknownTask, UnknownDocument) with the
    styled 404."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        response = self.get_response(request)
        if (
            settings.DEBUG
            and response.status_code == 404
            and not request.path.startswith(API_PREFIX)
            and not getattr(response, "streaming", False)
            and TECHNICAL_404_MARK in response.content
        ):
            return not_found(request)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if request.path.startswith(API_PREFIX):
            return None
        if isinstance(exception, (PermissionDenied, NotAllowed)):
            return forbidden(request, exception)
        if isinstance(exception, UnknownSession | UnknownTask | UnknownDocument):
            return not_found(request, exception)
        return None
