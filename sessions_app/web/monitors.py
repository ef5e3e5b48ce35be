"""The session page's monitors panel: each monitor's next run, its coverage
per source and partition (the last scan), and its last editions. Read-only:
monitors are made through the API or the agent's monitor.create tool."""

from __future__ import annotations

from typing import Any

from sessions_app import actions
from sessions_app.models import Session
from sessions_app.services import monitors

MONITORS_PANEL = "sessions/_monitors.html"
LAST_EDITIONS = 5


def monitors_context(session: Session, user: Any) -> dict[str, Any]:
    rows = actions.list_monitors(user, session.id)[:20]
    return {
        "session": session,
        "monitors": [
            {
                "monitor": m,
                "coverage": monitors.coverage(m),
                "editions": monitors.editions(m, limit=LAST_EDITIONS),
            }
            for m in rows
        ],
    }
