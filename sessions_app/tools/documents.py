"""The workspace tools' store: the session's documents, in the database.

The tools room sits below the runtime that owns documents
(runtime/documents.py), so the workspace.* tools reach them through a
backend the runtime registers when the app is ready (the shape of
tools/schedules.py). Every worker on every host reads the same store, so a
file written in one turn on one host is read in the next on another.
"""

from __future__ import annotations

import uuid
from typing import Protocol

from .base import ToolError


class Documents(Protocol):
    def read(self, session_id: uuid.UUID, name: str) -> bytes | None: ...

    def write(self, session_id: uuid.UUID, name: str, data: bytes, *, fence: int, call_id: str) -> str: ...

    def list(self, session_id: uuid.UUID, limit: int) -> list[tuple[str, int]]: ...

    def digest(self, session_id: uuid.UUID, name: str) -> str | None: ...


_backend: Documents | None = None


def register(backend: Documents) -> None:
    global _backend
    _backend = backend


def store() -> Documents:
    if _backend is None:
        raise ToolError("documents are not available in this process")
    return _backend
