"""The session's files, as the chat page's files panel lists them: one
selector, `workspace_files`, over the session's documents (the agent's
workspace lives in the database: runtime/documents.py), each at its head
with its version and who committed it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sessions_app.actions.access import session_for
from sessions_app.models import DocumentVersion
from sessions_app.services import documents as document_services

# The panel lists at most this many files.
MAX_FILES = 200

# Who committed a version, in the panel's words (DocumentVersion.by).
_WRITERS = {"agent": "the agent", "fork": "inherited (fork)", "": "the agent"}


@dataclass(frozen=True)
class WorkspaceFile:
    name: str  # the document's path, with / between parts
    size: int
    modified: datetime
    version: int  # the head's version within its incarnation
    writer: str  # who committed the head version


def workspace_files(user: Any, session_id: Any) -> list[WorkspaceFile]:
    """The live documents of a session the user may view, by name (at most MAX_FILES)."""
    session = session_for(user, session_id, "view")
    heads = document_services.listing(session.id).documents[:MAX_FILES]
    if not heads:
        return []
    rows = DocumentVersion.objects.filter(
        document__session_id=session.id, seq__in={d.seq for d in heads}, document__name__in=[d.name for d in heads]
    ).values_list("document__name", "document__incarnation", "version", "by", "created_at")
    meta = {(name, inc, ver): (by, at) for name, inc, ver, by, at in rows}
    found = []
    for d in heads:
        by, at = meta.get((d.name, d.incarnation, d.version), ("", None))
        writer = _WRITERS.get(by, by)
        found.append(WorkspaceFile(d.name, d.size, at or session.created_at, d.version, writer))
    return sorted(found, key=lambda f: f.name)
