"""Issue 27, point 6, at the pages: a form's integer past its column's range,
or a NUL in a token name, a title or a call id, is refused with its code (a
400, or for htmx a 200 that swaps with X-Terret-Error, as every page answers
a refusal), never a 500, and nothing is appended or made."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from sessions_app.models import ApiToken, Event, Schedule, Session
from tests.helpers import client_for
from tests.sessions_app.apiutil import make_reviewer, park_calls

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]
HTMX = {"HTTP_HX_REQUEST": "true"}


def _schedule(chat: Session) -> tuple[str, dict[str, Any]]:
    return reverse("sessions:schedule_create", args=[chat.id]), {"text": "t", "every_seconds": 2**31, "misfire": "skip"}


def _rename(chat: Session) -> tuple[str, dict[str, Any]]:
    return reverse("sessions:rename", args=[chat.id]), {"title": "trip\x00"}


def _decide_nul(chat: Session) -> tuple[str, dict[str, Any]]:
    return f"/approvals/sessions/{chat.id}/decide/", {"call_id": "c\x00", "verdict": "deny"}


def _decide_seq(chat: Session) -> tuple[str, dict[str, Any]]:
    return f"/approvals/sessions/{chat.id}/decide/", {"call_id": "c1", "seq": str(2**63), "verdict": "deny"}


@pytest.mark.parametrize(
    ("form", "named"),
    [
        pytest.param(_schedule, "every_seconds must be a whole number", id="schedule-every_seconds"),
        pytest.param(_rename, "a title must not contain NUL", id="rename-title-nul"),
        pytest.param(_decide_nul, "call id must not contain NUL", id="decide-call-id-nul"),
        pytest.param(_decide_seq, "request seq must be a whole number", id="decide-request-seq"),
    ],
)
def test_an_htmx_form_with_a_bad_value_says_its_code_and_appends_nothing(
    owner: Any, chat: Session, form: Any, named: str
) -> None:
    make_reviewer(owner)
    park_calls(chat.id, "c1")
    before = Event.objects.count()
    path, data = form(chat)
    response = client_for(owner).post(path, data, **HTMX)
    assert (response.status_code, response["X-Terret-Error"]) == (200, "invalid_input")
    assert named in response.content.decode()
    assert Event.objects.count() == before
    assert not Schedule.objects.exists()


def test_a_plain_post_of_the_schedule_form_redirects_with_the_error(owner: Any, chat: Session) -> None:
    path, data = _schedule(chat)
    response = client_for(owner).post(path, data)
    assert response.status_code == 302
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said == ["Nothing scheduled: every_seconds must be a whole number from 1 to 2147483647"]
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("name", ["lap\x00top", "\x00"])
def test_a_token_name_with_nul_is_a_400_and_no_token(owner: Any, name: str) -> None:
    response = client_for(owner).post(reverse("sessions:token_create"), {"name": name})
    assert response.status_code == 400 and "a token name must not contain NUL" in response.content.decode()
    assert not ApiToken.objects.exists()
