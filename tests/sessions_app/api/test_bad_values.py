"""Issue 27, point 6, at the JSON API: an integer past its column's range, or
a NUL (%00 in a path), is a 400 with a code, never a 500, and nothing is
appended or made (sessions_app/validation.py)."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import Schedule
from tests.sessions_app.apiutil import bearer, call, event_count, make_reviewer, new_session, park_calls, token_for
from tests.sessions_app.apiutil import session_url as url

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

HOURLY = {"text": "check the feed", "every_seconds": 3600}

BAD = [
    pytest.param(
        "POST",
        "/schedules",
        {"text": "t", "every_seconds": 2**31},
        "every_seconds must be a whole number",
        id="every_seconds",
    ),
    pytest.param("POST", "/schedules", {**HOURLY, "max_runs": 2**31}, "max_runs must be a whole number", id="max_runs"),
    pytest.param(
        "POST",
        "/schedules",
        {**HOURLY, "budget_tokens": 2**63},
        "budget_tokens must be a whole number",
        id="budget_tokens",
    ),
    pytest.param(
        "POST", "/approvals/c%00x", {"verdict": "approve"}, "call id must not contain NUL", id="approval-call-id-nul"
    ),
    pytest.param(
        "POST",
        "/approvals/c1",
        {"verdict": "approve", "request_seq": 2**63},
        "request seq must be a whole number",
        id="request_seq",
    ),
    pytest.param(
        "POST", "/effects/c%00x/resolve", {"action": "done"}, "call id must not contain NUL", id="effect-call-id-nul"
    ),
    pytest.param(
        "POST",
        "/approvals/c1",
        {"verdict": "approve", "edited_args": {"path": "a\ud800"}},
        "must not contain lone surrogates",
        id="lone-surrogate",
    ),
]


@pytest.fixture
def boss(make_user: Any) -> Any:
    """Staff and a reviewer: no permission check stands before the value's."""
    return make_reviewer(make_user("boss", is_staff=True))


@pytest.mark.parametrize(("method", "tail", "body", "named"), BAD)
def test_a_bad_value_is_a_400_with_a_code_and_nothing_is_appended(
    client: Any, boss: Any, method: str, tail: str, body: Any, named: str
) -> None:
    session = new_session(boss)
    park_calls(session.id, "c1")
    before = event_count()
    response = call(client, method, url(session, tail), body, **bearer(token_for(boss)))
    assert (response.status_code, response.data["code"]) == (400, "invalid_input"), response.content
    assert named in response.data["message"]
    assert event_count() == before
    assert Schedule.objects.count() == 0


def test_the_largest_values_the_columns_hold_are_taken(client: Any, boss: Any, settings: Any) -> None:
    session = new_session(boss)
    # The column holds 2^31 - 1 seconds (68 years), past the schedule horizon:
    # the first due time is refused by that rule, not by the column (nothing made).
    longest = settings.TERRET_SCHEDULE_HORIZON_DAYS * 86_400
    body = {**HOURLY, "every_seconds": 2**31 - 1, "max_runs": 2**31 - 1, "budget_tokens": 2**63 - 1}
    response = call(client, "POST", url(session, "/schedules"), body, **bearer(token_for(boss)))
    assert (response.status_code, response.json()["code"]) == (400, "time_out_of_range")
    assert not Schedule.objects.exists()
    response = call(
        client, "POST", url(session, "/schedules"), {**body, "every_seconds": longest}, **bearer(token_for(boss))
    )
    assert response.status_code == 201, response.content
    made = Schedule.objects.get()
    assert (made.every_seconds, made.max_runs, made.budget_tokens) == (longest, 2**31 - 1, 2**63 - 1)
