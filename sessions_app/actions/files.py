"""The session's files, as the chat page's files panel shows them: the
selectors over the session's documents (the agent's workspace lives in the
database: runtime/documents.py). `workspace_files` lists them, each at its
head with its version and who committed it; `workspace_file` is one version
of one, with its bytes, its writer and the versions of its incarnation;
`upload_limit` is the largest file an upload may be. The panel's upload
writes through `actions.write_document`, the API's PUT verb."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sessions_app.actions.access import session_for
from sessions_app.models import AgentProfile, DocumentVersion, Session
from sessions_app.services import documents as document_services

# The panel lists at most this many files.
MAX_FILES = 200
# A file's page links at most this many of its versions (the newest).
MAX_VERSIONS = 50

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
        writer = writer_label(by)
        found.append(WorkspaceFile(d.name, d.size, at or session.created_at, d.version, writer))
    return sorted(found, key=lambda f: f.name)


def writer_label(by: str) -> str:
    """Who committed a version, in the panel's words (a person's username as is)."""
    return _WRITERS.get(by, by)


@dataclass(frozen=True)
class FileVersion:
    """One version of a file, as its page shows it."""

    name: str
    version: int
    head: int  # the live incarnation's newest version
    size: int
    data: bytes
    writer: str
    modified: datetime | None
    versions: list[int]  # the incarnation's versions, newest first (at most MAX_VERSIONS)

    @property
    def is_head(self) -> bool:
        return self.version == self.head


def workspace_file(user: Any, session_id: Any, name: Any, version: int | None = None) -> FileVersion:
    """A file of a session the user may view: its head, or `version` of its
    live incarnation (UnknownDocument when there is none)."""
    session = session_for(user, session_id, "view")
    content = document_services.read(session.id, name, version).content
    info = content.info
    # (session, name, incarnation) is one Document row: a retired name's next
    # life is another incarnation, a fork's copy another session's row.
    rows = DocumentVersion.objects.filter(
        document__session_id=session.id, document__name=info.name, document__incarnation=info.incarnation
    )
    versions = list(rows.order_by("-version").values_list("version", flat=True)[:MAX_VERSIONS])
    by, at = rows.filter(version=info.version).values_list("by", "created_at").first() or ("", None)
    return FileVersion(
        name=info.name,
        version=info.version,
        head=versions[0] if versions else info.version,
        size=info.size,
        data=content.data,
        writer=writer_label(by),
        modified=at,
        versions=versions,
    )


def upload_limit(session: Session) -> int:
    """The largest file an upload of `session` may be: its profile's
    max_document_bytes, read from the live row as every write reads it. A
    door checks it before reading an upload into memory; the store checks it
    again when it writes, and its answer is the one that counts."""
    field = AgentProfile._meta.get_field("max_document_bytes")
    value = None
    if session.profile_id is not None:
        value = AgentProfile.objects.filter(pk=session.profile_id).values_list(field.name, flat=True).first()
    return int(value if value is not None else field.default)
