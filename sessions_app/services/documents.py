"""A session's documents for people: listed, read, written by the owner.

The store is runtime/documents.py (what a document is, its versions and
bounds); this module is what the doors' verbs call (the API's PUT and the
chat page's upload alike). A person's write is an ordinary durable write,
logged as document/written like the agent's, and unfenced: a person holds
no lease.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessions_app.errors import InvalidInput, SessionRevoked, TerretError
from sessions_app.models import Document, DocumentVersion, Session
from sessions_app.runtime import documents
from sessions_app.runtime.materialize import files_under
from sessions_app.validation import int_in_column

ENCODINGS = ("utf-8", "base64")
LIST_LIMIT = 1000
_VERSION = DocumentVersion._meta.get_field("version")
_INCARNATION = Document._meta.get_field("incarnation")


@dataclass(frozen=True)
class Listing:
    session_id: uuid.UUID
    documents: list[documents.Info]
    truncated: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "session_id": str(self.session_id),
            "documents": [d.as_json() for d in self.documents],
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class Read:
    content: documents.Content

    def as_json(self) -> dict[str, Any]:
        text = self.content.text()
        out = self.content.info.as_json()
        if text is not None:
            out.update(encoding="utf-8", content=text)
        else:
            out.update(encoding="base64", content=base64.b64encode(self.content.data).decode())
        return out


def listing(session_id: uuid.UUID) -> Listing:
    rows = documents.listing(session_id, limit=LIST_LIMIT + 1)
    return Listing(session_id, rows[:LIST_LIMIT], len(rows) > LIST_LIMIT)


def read(session_id: uuid.UUID, name: Any, version: Any = None) -> Read:
    if version is not None:
        version = int_in_column("version", version, _VERSION, minimum=1)
    return Read(documents.read(session_id, name, version=version))


def _decode(content: Any, encoding: Any) -> bytes:
    if not isinstance(content, str):
        raise InvalidInput("content must be a string")
    if encoding not in ENCODINGS:
        raise InvalidInput(f"encoding must be one of {', '.join(ENCODINGS)}")
    if encoding == "utf-8":
        return content.encode("utf-8", errors="strict")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("content is not valid base64") from None


def write(session_id: uuid.UUID, name: Any, body: dict[str, Any], *, by: str) -> documents.Info:
    """The owner's write (PUT): a new version of `name`, or a new document.
    `incarnation` (and `version`), when given, must still be the document's:
    DocumentConflict otherwise, and nothing is written. A revoked session
    takes no write from a person (SessionRevoked), as it takes no input: the
    agent would read the file on its next turn, so a file is input too."""
    if Session.objects.filter(id=session_id, revoked_seq__isnull=False).exists():
        raise SessionRevoked(f"session {session_id} is revoked; a staff member must restore it first")
    data = _decode(body.get("content"), body.get("encoding") or "utf-8")
    expect = None
    if body.get("incarnation") is not None:
        version = body.get("version")
        expect = documents.Handle(
            session_id,
            documents.clean_name(name),
            int_in_column("incarnation", body["incarnation"], _INCARNATION, minimum=1),
            None if version is None else int_in_column("version", version, _VERSION, minimum=1),
        )
    return documents.write(
        session_id,
        name,
        data,
        kind=body.get("kind") or "file",
        scope=body.get("scope") or "conversation",
        schema=body.get("schema") or "",
        schema_version=body.get("schema_version"),
        task=body.get("task") or "",
        expect=expect,
        by=by,
    )


# ---------------------------------------------------------------- from a directory

# Left behind by the directory workspace of earlier releases: debug.charge's
# record (not the agent's world) and the write tool's temporary files.
NOT_IMPORTED_TOP = ("charges.log",)
TEMP_PREFIX = ".terret-write-"


@dataclass
class Imported:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)


def import_directory(session_id: uuid.UUID, source: Path, *, by: str = "import") -> Imported:
    """Write each regular file under `source` (an earlier release's
    workspace directory) as a version of the session's document of that
    path; a file whose content is the document's head already is left, so
    running it again writes nothing. Symlinks are not followed; a file a
    bound or the path rules refuse is named with the reason."""
    out = Imported()
    for name, path in sorted(files_under(source).items()):
        if name in NOT_IMPORTED_TOP or path.name.startswith(TEMP_PREFIX):
            continue
        data = path.read_bytes()
        if documents.head_digest(session_id, name) == hashlib.sha256(data).hexdigest():
            out.unchanged.append(name)
            continue
        try:
            documents.write(session_id, name, data, by=by)
        except TerretError as exc:
            out.refused.append((name, str(exc)))
            continue
        out.written.append(name)
    return out
