"""Every answer under /api/ is JSON, whatever the method and path.

The API's own views render their errors (api/views.py), but some answers
come from Django before any API view runs: the CSRF check's 403 page, a
method a path does not take (405), a 404 or 500 from outside ninja. Under
/api/ those are replaced by the API's error body with the same status, so a
program never has to parse an HTML page. Pages elsewhere are left alone.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from sessions_app.errors import TerretError, error_body

PREFIX = "/api/"

_CODES: dict[int, tuple[str, str]] = {
    400: ("invalid_input", "bad request"),
    403: ("csrf_failed", "cookie-authenticated writes need the X-CSRFToken header (or use a token)"),
    404: ("not_found", "no such API path"),
    405: ("method_not_allowed", "this API path does not take that method"),
    413: ("payload_too_large", "the request body is too large"),
    500: ("internal_error", "internal error"),
    503: ("database_unavailable", "the database is unavailable; retry after the Retry-After seconds"),
}


class JsonApiErrorsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith(PREFIX) or response.status_code < 400:
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        code, message = _CODES.get(response.status_code, ("error", "request failed"))
        error = TerretError(message)
        error.code = code
        replaced = JsonResponse(error_body(error), status=response.status_code)
        if response.has_header("Allow"):
            replaced["Allow"] = response["Allow"]
        if response.has_header("Retry-After"):
            replaced["Retry-After"] = response["Retry-After"]
        return replaced
