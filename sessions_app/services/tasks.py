"""Owned tasks as people see and stop them (the runtime's store holds the
rows and their writes: runtime/owned/store.py).

A cancel commits abort intent first; the task's supervisor (or, with none,
a fresh claim or the reaper) signals and settles it: the answer is the task
as it stands, `aborting` until its cancelled receipt.
"""

from __future__ import annotations

import uuid
from typing import Any

from sessions_app.errors import UnknownTask
from sessions_app.models import Task
from sessions_app.runtime.owned import store

as_json = store.as_json
LIST_LIMIT = 200  # a session's tasks listed, newest first (bounded: the oldest are left off)


def of_session(session_id: uuid.UUID | str) -> list[Task]:
    return list(Task.objects.filter(session_id=session_id).order_by("-created_at")[:LIST_LIMIT])


def owner_of(task_id: Any) -> uuid.UUID:
    """The session owning task `task_id` (UnknownTask when there is none)."""
    try:
        tid = uuid.UUID(str(task_id))
    except ValueError:
        raise UnknownTask(f"no task {task_id!r}") from None
    sid = Task.objects.filter(id=tid).values_list("session_id", flat=True).first()
    if sid is None:
        raise UnknownTask(f"no task {tid}")
    return sid


def get(session_id: uuid.UUID | str, task_id: Any) -> Task:
    return store.task_of(session_id, task_id)


def cancel(session_id: uuid.UUID | str, task_id: Any, *, by: str) -> Task:
    task = store.task_of(session_id, task_id)
    store.request_abort([task], f"cancelled by {by}" if by else "cancelled")
    task.refresh_from_db()
    return task


def parent_of(session_id: uuid.UUID | str) -> dict[str, str] | None:
    """A child session's parent: {session_id, task_id} (None: not a subagent's)."""
    row = Task.objects.filter(child_session_id=uuid.UUID(str(session_id))).values("id", "session_id").first()
    if row is None:
        return None
    return {"session_id": str(row["session_id"]), "task_id": str(row["id"])}
