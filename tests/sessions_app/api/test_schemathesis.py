"""Property-based run of the JSON API against its own OpenAPI document
(schemathesis, positive and negative examples): no 5xx, every status and
body as documented, invalid input rejected, auth enforced.

Bounded: SCHEMATHESIS_MAX_EXAMPLES examples per operation and mode (default
25) and pytest-timeout. Requests go through the real WSGI stack (middleware,
auth, CSRF) in-process, against the test database.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.sessions_app.apiutil import make_reviewer, new_session, park_calls, token_for

MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "25"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
]

schema = schemathesis.openapi.from_wsgi("/api/openapi.json", WSGIHandler())
schema.config.generation.update(modes=["positive", "negative"], max_examples=MAX_EXAMPLES)

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(600)]


@pytest.fixture
def api_world(make_user, settings):
    """A reviewer who owns a session with a call parked, so requests reach
    the services instead of stopping at 404."""
    settings.TERRET_WORKER = "manual"
    # The test database transaction must survive each in-process request
    # (Django's test client disconnects this handler for the same reason).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    owner = make_reviewer(make_user("schema-owner"))
    session = new_session(owner)
    park_calls(session.id, "c1")
    yield {"token": token_for(owner), "sid": str(session.id)}
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_schema(case, api_world):
    if case.path_parameters and "session_id" in case.path_parameters:
        case.path_parameters["session_id"] = api_world["sid"]
    case.call_and_validate(headers={"Authorization": f"Bearer {api_world['token']}"}, checks=CHECKS)
