"""Monitors: a session's recurring collection jobs, made, read and
cancelled; an edition of unknown outcome resolved. A monitor is reached by
its own id on some doors, so the verb finds its session and asks the one
access rule about that; a monitor of a session the user cannot read is
UnknownMonitor (404), the same as one that does not exist."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.errors import UnknownMonitor, UnknownSession
from sessions_app.models import Edition, Monitor
from sessions_app.services import monitors


def _monitor(user: Any, monitor_id: Any, need: Any) -> Monitor:
    m = monitors.get(monitor_id)
    try:
        session_for(user, m.session_id, need)
    except UnknownSession:
        raise UnknownMonitor(f"no monitor {monitor_id!r}") from None
    return m


def list_monitors(user: Any, session_id: Any) -> list[Monitor]:
    session = session_for(user, session_id, "view")
    return monitors.of_session(session.id)


def create_monitor(user: Any, session_id: Any, body: dict[str, Any]) -> tuple[Monitor, bool]:
    """The monitor, and whether it is new (False: the same idempotency key
    and request answered the one made before)."""
    session = session_for(user, session_id, "drive")
    return monitors.create(session.id, body, by=by(user))


def monitor(user: Any, monitor_id: Any) -> Monitor:
    return _monitor(user, monitor_id, "view")


def monitor_editions(user: Any, monitor_id: Any, *, limit: int = monitors.MAX_EDITIONS_READ) -> list[Edition]:
    return monitors.editions(_monitor(user, monitor_id, "view"), limit=limit)


def cancel_monitor(user: Any, monitor_id: Any) -> Monitor:
    m = _monitor(user, monitor_id, "drive")
    return monitors.cancel(m.session_id, m.id, by=by(user))


def resolve_edition(
    user: Any, monitor_id: Any, edition_id: Any, action: str, receipt: str = "", reason: str = ""
) -> Edition:
    """The effect resolution of the edition's send (actions/effects.py resolve), reached by the edition."""
    m = _monitor(user, monitor_id, "resolve")
    return monitors.resolve_edition(m, edition_id, action, receipt=receipt, reason=reason, by=by(user))
