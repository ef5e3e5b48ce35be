"""A request that meets a database outage gets 503 and Retry-After, not 500."""

from __future__ import annotations

from django.db import OperationalError
from django.http import HttpResponse
from django.test import RequestFactory

from terret_site.middleware import DatabaseOutageMiddleware


def test_a_database_outage_is_answered_503_with_retry_after() -> None:
    middleware = DatabaseOutageMiddleware(lambda request: HttpResponse())
    request = RequestFactory().get("/api/sessions")
    response = middleware.process_exception(
        request, OperationalError("terminating connection due to administrator command")
    )
    assert response is not None
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert b"database_unavailable" in response.content


def test_other_exceptions_are_left_to_django() -> None:
    middleware = DatabaseOutageMiddleware(lambda request: HttpResponse())
    assert middleware.process_exception(RequestFactory().get("/"), ValueError("a bug")) is None
