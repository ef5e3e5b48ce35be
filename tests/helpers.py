"""Plain helpers shared by the tests (fixtures live in conftest.py files)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from django.test import Client

from sessions_app.models import Event, Session


def kinds(session: Session, after: int = 0) -> list[str]:
    """The kinds of the session's events after `after`, in seq order."""
    return list(Event.objects.filter(session=session, seq__gt=after).order_by("seq").values_list("kind", flat=True))


def events(session: Session, kind: str) -> list[dict[str, Any]]:
    """The payloads of the session's events of one kind, in seq order."""
    return list(Event.objects.filter(session=session, kind=kind).order_by("seq").values_list("data", flat=True))


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll until `predicate` returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client_for(user: Any, **kwargs: Any) -> Client:
    """A Django test client signed in as `user`."""
    c = Client(**kwargs)
    c.force_login(user)
    return c


def edit_profile(profile: Any, **fields: Any) -> Any:
    """Change a profile as the admin does (a save, so a new agent version is
    recorded: runtime/versions.py); `.update()` records none, and a turn runs
    under its version's snapshot, not the live row."""
    from sessions_app.models import AgentProfile  # local: tests.helpers loads before Django's apps in some runs

    row = AgentProfile.objects.get(pk=getattr(profile, "pk", profile))
    for name, value in fields.items():
        setattr(row, name, value)
    row.save()
    return row


def document_text(session_id: Any, name: str) -> str | None:
    """A session's document (its workspace file) as text; None: there is none."""
    from sessions_app.errors import UnknownDocument  # local: tests.helpers loads before Django's apps in some runs
    from sessions_app.runtime import documents  # local: as above

    try:
        return documents.read(session_id, name).data.decode()
    except UnknownDocument:
        return None
