"""Owned tasks: a session's tasks listed, one task read, a task cancelled.
The verbs return Task rows; `task_json` is their one JSON shape (the API's
TaskOut declares it). A task is as visible as the session that owns it: a
task of a session the user may not see is UnknownTask (404), as if absent."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.errors import UnknownSession, UnknownTask
from sessions_app.models import Task
from sessions_app.services import tasks

task_json = tasks.as_json


def list_tasks(user: Any, session_id: Any) -> list[Task]:
    session = session_for(user, session_id, "view")
    return tasks.of_session(session.id)


def session_parent(session: Any) -> dict[str, str] | None:
    """A subagent's child session's parent {session_id, task_id}, for a door
    that let its reader in already (the /lg/ thread's metadata)."""
    return tasks.parent_of(session.id)


def _owned(user: Any, task_id: Any, need: Any) -> Any:
    sid = tasks.owner_of(task_id)
    try:
        return session_for(user, sid, need)
    except UnknownSession:
        raise UnknownTask(f"no task {task_id}") from None


def task_detail(user: Any, task_id: Any) -> Task:
    session = _owned(user, task_id, "view")
    return tasks.get(session.id, task_id)


def cancel_task(user: Any, task_id: Any) -> Task:
    session = _owned(user, task_id, "drive")
    return tasks.cancel(session.id, task_id, by=by(user))
