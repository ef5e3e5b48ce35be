"""A session's documents: listed and read by whoever may view the session,
written by whoever may drive it (its owner, or staff)."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.services import documents as document_services
from sessions_app.services.documents import Listing, Read


def documents(user: Any, session_id: Any) -> Listing:
    """The session's live documents, each at its head."""
    session = session_for(user, session_id, "view")
    return document_services.listing(session.id)


def document(user: Any, session_id: Any, name: Any, version: Any = None) -> Read:
    """One document's content: its head, or `version` of its live incarnation."""
    session = session_for(user, session_id, "view")
    return document_services.read(session.id, name, version)


def write_document(user: Any, session_id: Any, name: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Write a document as its session's owner: a durable write, logged as
    document/written. The new version as listed."""
    session = session_for(user, session_id, "drive")
    return document_services.write(session.id, name, body, by=by(user)).as_json()
