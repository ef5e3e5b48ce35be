"""The chat page's schedules panel and the console's list: schedules made
and cancelled from the page (htmx answered 200 with the panel, errors in
it), a reader sees the list without the buttons and may not post, and the
operators' console lists every live schedule."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from sessions_app.models import Event, Schedule, Session
from sessions_app.services import schedules
from tests.helpers import client_for
from tests.sessions_app.apiutil import make_reviewer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]
HTMX = {"HTTP_HX_REQUEST": "true"}


def later(minutes: int = 30) -> str:
    return (timezone.now() + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M")


def test_the_owner_schedules_and_cancels_from_the_page(owner: Any, chat: Session) -> None:
    c = client_for(owner)
    page = c.get(reverse("sessions:chat", args=[chat.id])).content.decode()
    assert 'id="schedules"' in page and "No schedules" in page and 'id="schedule-form"' in page
    r = c.post(
        reverse("sessions:schedule_create", args=[chat.id]),
        {"text": "check the deploy", "due_at": later(), "misfire": "skip", "reason": "deploy"},
        **HTMX,
    )
    assert r.status_code == 200
    html = r.content.decode()
    assert "Scheduled; first wake-up" in html and "deploy" in html
    s = Schedule.objects.get(session=chat)
    assert (s.created_by, s.misfire, s.status) == ("owner", "skip", "pending")
    assert abs((s.due_at - timezone.now()).total_seconds() - 1800) < 120, "the form's time is UTC"
    r = c.post(reverse("sessions:schedule_cancel", args=[chat.id, s.id]), **HTMX)
    assert "Schedule cancelled." in r.content.decode()
    s.refresh_from_db()
    assert s.status == "cancelled"
    assert Event.objects.filter(session=chat, kind="schedule/cancelled").count() == 1


def test_errors_are_shown_in_the_panel_and_nothing_is_made(owner: Any, chat: Session) -> None:
    c = client_for(owner)
    r = c.post(reverse("sessions:schedule_create", args=[chat.id]), {"text": "x", "misfire": "skip"}, **HTMX)
    assert r.status_code == 200
    assert "Nothing scheduled" in r.content.decode() and 'role="alert"' in r.content.decode()
    r = c.post(
        reverse("sessions:schedule_create", args=[chat.id]),
        {"text": "x", "every_seconds": 1, "misfire": "skip"},
        **HTMX,
    )
    assert "shortest interval" in r.content.decode()
    for when in ("0001-01-01T00:00", "9999-12-31T23:59"):
        body = {"text": "x", "due_at": when, "misfire": "skip"}
        r = c.post(reverse("sessions:schedule_create", args=[chat.id]), body, **HTMX)
        assert r.status_code == 200 and "due_at must be within" in r.content.decode()
    assert Schedule.objects.count() == 0


def test_a_reader_sees_the_list_but_may_not_post(make_user: Any, chat: Session) -> None:
    schedules.create(chat.id, {"text": "wake", "due_at": timezone.now() + timedelta(hours=1)}, by="owner")
    reviewer = make_reviewer(make_user("rev"))
    c = client_for(reviewer)
    page = c.get(reverse("sessions:chat", args=[chat.id])).content.decode()
    assert "schedule-list" in page and 'id="schedule-form"' not in page
    r = c.post(reverse("sessions:schedule_create", args=[chat.id]), {"text": "x", "due_at": later()})
    assert r.status_code == 403  # readable, not drivable: 403 on every door (actions.access)
    assert Schedule.objects.count() == 1


def test_the_console_lists_live_schedules(make_user: Any, chat: Session) -> None:
    s, _ = schedules.create(chat.id, {"text": "hourly feed", "every_seconds": 3600}, by="owner")
    staff = make_user("ops", is_staff=True)
    page = client_for(staff).get(reverse("sessions:console")).content.decode()
    assert f'id="ops-schedule-{s.id}"' in page and "hourly feed" in page


def test_the_form_reads_its_time_as_the_readers_local_time(owner: Any, chat: Session) -> None:
    """Issue 34: a datetime-local input is the reader's wall clock; the page
    sends the browser's offset (getTimezoneOffset: UTC minus local) with it."""
    c = client_for(owner)
    local = timezone.now() + timedelta(hours=9, minutes=30)  # 30 minutes from now, on a clock at UTC+9
    body = {"text": "from Tokyo", "due_at": local.strftime("%Y-%m-%dT%H:%M"), "tz_offset": "-540", "misfire": "skip"}
    r = c.post(reverse("sessions:schedule_create", args=[chat.id]), body, **HTMX)
    assert r.status_code == 200, r.content.decode()
    s = Schedule.objects.get(session=chat)
    assert abs((s.due_at - timezone.now()).total_seconds() - 1800) < 120
    c.post(reverse("sessions:schedule_create", args=[chat.id]), {**body, "tz_offset": "99999"}, **HTMX)
    assert Schedule.objects.filter(session=chat).count() == 1  # an offset no zone has is refused
