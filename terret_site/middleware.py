"""A request that meets a database outage is answered 503 with Retry-After.

After a PostgreSQL restart every pooled connection is dead, and each request
would draw one and fail with a 500 until the pool had cycled through them.
Here the first such failure also has the pool check its idle connections, so
the next request gets a live one, and the client is told to retry: nothing
was committed by a request whose database went away (a commit that succeeded
is answered normally; runtime/dispatch.py keeps a broker outage from turning
accepted input into an error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

from sessions_app.runtime import failures

logger = logging.getLogger(__name__)


class DatabaseOutageMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not isinstance(exc, OperationalError | InterfaceError):
            return None
        logger.warning("%s %s: database unavailable (%s)", request.method, request.path, exc)
        failures.drop_dead_connections()
        body = {"code": "database_unavailable", "message": "the database is unavailable; retry shortly"}
        return JsonResponse(body, status=503, headers={"Retry-After": "1"})
