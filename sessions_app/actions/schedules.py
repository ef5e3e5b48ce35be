"""Schedules: a session's scheduled wake-ups, listed, made and cancelled.
The verbs return `Schedule` rows; each door shapes them (services.schedules.
as_json is the one JSON shape, used by the API's and the socket's)."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.models import Schedule
from sessions_app.services import schedules


def list_schedules(user: Any, session_id: Any) -> list[Schedule]:
    session = session_for(user, session_id, "view")
    return list(schedules.of_session(session.id))


def create_schedule(user: Any, session_id: Any, body: dict[str, Any]) -> tuple[Schedule, bool]:
    """The schedule, and whether it is new (False: the same idempotency key
    and request answered the one made before)."""
    session = session_for(user, session_id, "drive")
    return schedules.create(session.id, body, by=by(user))


def cancel_schedule(user: Any, session_id: Any, schedule_id: str) -> Schedule:
    session = session_for(user, session_id, "drive")
    return schedules.cancel(session.id, schedule_id, by=by(user))
