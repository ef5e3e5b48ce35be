"""The session page's schedules panel: its list, a form to schedule a
wake-up, and a cancel button per live schedule. Thin views over
services/schedules.py; htmx gets the panel back (200, so it swaps, with
the error in it and its code in X-Terret-Error), a plain POST a redirect to
the chat with a message.
"""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_POST

from sessions_app import actions
from sessions_app.actions import session_for
from sessions_app.errors import NotAllowed, TerretError, UnknownSession
from sessions_app.models import Schedule, Session
from sessions_app.services import schedules
from sessions_app.web import panels

PANEL = "sessions/_schedules.html"


class ScheduleForm(forms.Form):
    text = forms.CharField(max_length=2000, strip=True)
    due_at = forms.DateTimeField(
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        label="At (your local time)",
        help_text="without script in the page: UTC",
    )
    # The browser's offset from UTC at that time, in minutes (JavaScript's
    # getTimezoneOffset: UTC minus local), set by terret-live.js on submit:
    # a datetime-local input is the reader's wall-clock time, never UTC.
    tz_offset = forms.IntegerField(required=False, min_value=-1080, max_value=1080, widget=forms.HiddenInput)
    every_seconds = forms.IntegerField(required=False, min_value=1, label="Or every (seconds)")
    cron = forms.CharField(required=False, max_length=120, label="Or cron (UTC)")
    misfire = forms.ChoiceField(choices=[(m, m) for m in Schedule.MISFIRES], initial="run_once")
    reason = forms.CharField(required=False, max_length=200)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Its own ids: the chat page's composer is id_text, and labels find fields by id.
        kwargs.setdefault("auto_id", "schedule_%s")
        super().__init__(*args, **kwargs)

    def body(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        when = data.pop("due_at")
        offset = data.pop("tz_offset", None)
        if when is not None:
            # The wall-clock time typed (Django made it aware in the server's
            # zone), as the reader's local time: moved to UTC by the browser's
            # offset, or read as UTC when no script sent one (the help says so).
            wall = timezone.make_naive(when) if timezone.is_aware(when) else when
            data["due_at"] = wall.replace(tzinfo=UTC) + timedelta(minutes=offset or 0)
        return {k: v for k, v in data.items() if v not in (None, "")}


def panel_context(session: Session, user: Any, **extra: Any) -> dict[str, Any]:
    return {
        "session": session,
        "schedules": schedules.of_session(session.id)[:50],
        "can_drive": actions.allowed(user, session, "drive"),
        "schedule_form": extra.pop("form", None) or ScheduleForm(),
        **extra,
    }


def _answer(
    request: HttpRequest, session: Session, *, notice: str = "", error: str = "", code: str = "", form: Any = None
) -> HttpResponse:
    def context() -> dict[str, Any]:
        return panel_context(session, request.user, form=form, schedule_notice=notice, schedule_error=error)

    return panels.answer(request, session, template=PANEL, context=context, notice=notice, error=error, code=code)


@login_required
@require_POST
def create(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    session = session_for(request.user, session_id, "drive")
    form = ScheduleForm(request.POST)
    if not form.is_valid():
        problems = " ".join(f"{name}: {' '.join(str(e) for e in errs)}" for name, errs in form.errors.items())
        return _answer(request, session, error=f"Nothing scheduled: {problems}", form=form)
    try:
        made, _ = actions.create_schedule(request.user, session.id, form.body())
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:
        return _answer(request, session, error=f"Nothing scheduled: {exc}", code=exc.code, form=form)
    when = made.due_at.strftime("%Y-%m-%d %H:%M:%S UTC") if made.due_at else "never"
    return _answer(request, session, notice=f"Scheduled; first wake-up {when}.")


@login_required
@require_POST
def cancel(request: HttpRequest, session_id: uuid.UUID, schedule_id: uuid.UUID) -> HttpResponse:
    session = session_for(request.user, session_id, "drive")
    try:
        actions.cancel_schedule(request.user, session.id, str(schedule_id))
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:
        return _answer(request, session, error=f"Not cancelled: {exc}", code=exc.code)
    return _answer(request, session, notice="Schedule cancelled.")


def due_soon(limit: int = 100) -> list[Schedule]:
    """The console's list: live schedules, the soonest due first."""
    live = Schedule.objects.filter(status__in=("pending", "paused")).select_related("session")
    return list(live.order_by("due_at")[:limit])
