"""The workspace tools' store: the session's documents, in the database.

The tools room sits below the runtime that owns documents
(runtime/documents.py), so the workspace.* tools reach them through a
backend the runtime registers when the app is ready (the shape of
tools/schedules.py). Every worker on every host reads the same store, so a
file written in one turn on one host is read in the next on another.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .base import ToolError


class Directory(Protocol):
    """A scratch directory of one session's documents that a long-lived
    program (an MCP server with `"workspace": true`) works in, call after call
    (runtime/materialize.py)."""

    @property
    def path(self) -> Path: ...

    def refresh(self) -> None:
        """Bring the directory to the documents' heads (before a call)."""

    def commit(self, fence: int) -> list[str]:
        """Commit what changed, fenced on the lease generation `fence` (after
        a call); what could not be kept, one sentence each (none: [])."""

    def remove(self) -> None: ...


class Documents(Protocol):
    def read(self, session_id: uuid.UUID, name: str) -> bytes | None: ...

    def write(self, session_id: uuid.UUID, name: str, data: bytes, *, fence: int, call_id: str) -> str: ...

    def list(self, session_id: uuid.UUID, limit: int) -> list[tuple[str, int]]: ...

    def digest(self, session_id: uuid.UUID, name: str) -> str | None: ...


# A new Directory of a session's documents, written by `by` (e.g. "mcp:files").
DirectoryFactory = Callable[[uuid.UUID, str], Directory]

# A new empty directory of this process's, named for `purpose` (e.g. "mcp-list").
EmptyFactory = Callable[[str], Path]

_backend: Documents | None = None
_directories: DirectoryFactory | None = None
_empties: EmptyFactory | None = None


def register(backend: Documents) -> None:
    global _backend
    _backend = backend


def store() -> Documents:
    if _backend is None:
        raise ToolError("documents are not available in this process")
    return _backend


def register_directories(factory: DirectoryFactory, empty: EmptyFactory) -> None:
    global _directories, _empties
    _directories, _empties = factory, empty


def directory(session_id: uuid.UUID, by: str) -> Directory:
    """A new scratch directory holding the session's documents."""
    if _directories is None:
        raise ToolError("documents are not available as a directory in this process")
    return _directories(session_id, by)


def empty_directory(purpose: str) -> Path:
    """A new empty directory of this process's, under the host's scratch
    root like every session's, so a killed process's is swept with theirs."""
    if _empties is None:
        raise ToolError("scratch directories are not available in this process")
    return _empties(purpose)
