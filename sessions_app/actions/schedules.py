"""Schedules: a session's scheduled wake-ups, listed, made and cancelled."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.services import schedules


def list_schedules(user: Any, session_id: Any) -> dict[str, Any]:
    session = session_for(user, session_id, "view")
    return {"schedules": [schedules.as_json(s) for s in schedules.of_session(session.id)]}


def create_schedule(user: Any, session_id: Any, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    session = session_for(user, session_id, "drive")
    made, new = schedules.create(session.id, body, by=by(user))
    return schedules.as_json(made), new


def cancel_schedule(user: Any, session_id: Any, schedule_id: str) -> dict[str, Any]:
    session = session_for(user, session_id, "drive")
    return schedules.as_json(schedules.cancel(session.id, schedule_id, by=by(user)))
