"""The session's files, as the chat page's files panel lists them: one
selector, `workspace_files`, so the panel can be fed from another store
later (the workspace is moving into database documents) by changing this
function alone.

Read only: the workspace directory the built-in workspace tools write to
(tools/builtins.py), and the log's successful `workspace.write` calls for
each file's version (how many writes the log records) and last writer.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from sessions_app.actions.access import session_for
from sessions_app.models import Event
from sessions_app.tools.builtins import workspace_dir

# The panel lists at most this many files, and reads at most this many of
# the log's assistant messages to find the writes.
MAX_FILES = 200
MAX_MESSAGES = 2000


@dataclass(frozen=True)
class WorkspaceFile:
    name: str  # the path inside the workspace, with / between parts
    size: int
    modified: datetime
    version: int  # successful workspace.write calls the log records for it (0: written outside the log)
    writer: str  # who wrote it last, as far as the log says


def _writes(session_id: uuid.UUID) -> dict[str, tuple[int, str]]:
    """{path: (writes, last writer)} from the log's successful workspace.write calls."""
    # is_error is tested here, not in SQL: a result without the key must count,
    # and a JSON key's NOT in SQL drops the rows where it is missing.
    results = Event.objects.filter(session_id=session_id, kind="tool/result", data__name="workspace.write")
    done = {d.get("call_id") for d in results.values_list("data", flat=True) if d and not d.get("is_error")}
    if not done:
        return {}
    out: dict[str, tuple[int, str]] = {}
    messages = (
        Event.objects.filter(session_id=session_id, kind="assistant/message")
        .order_by("-seq")
        .values_list("data", flat=True)[:MAX_MESSAGES]
    )
    for data in reversed(list(messages)):
        for call in (data or {}).get("tool_calls") or []:
            if call.get("name") != "workspace.write" or call.get("id") not in done:
                continue
            try:
                path = str(json.loads(call.get("arguments") or "{}").get("path", ""))
            except (ValueError, AttributeError):
                continue
            name = PurePosixPath(path.lstrip("/")).as_posix()
            count, _ = out.get(name, (0, ""))
            out[name] = (count + 1, "the agent")
    return out


def workspace_files(user: Any, session_id: Any) -> list[WorkspaceFile]:
    """The files of a session the user may view, by name (at most MAX_FILES)."""
    session = session_for(user, session_id, "view")
    root = workspace_dir(session.id)
    if not root.is_dir():
        return []
    writes = _writes(session.id)
    found: list[WorkspaceFile] = []
    for current, dirs, names in os.walk(root):  # does not descend into symlinked dirs
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(current, name)
            if os.path.islink(path):
                continue
            stat = os.stat(path)
            rel = PurePosixPath(os.path.relpath(path, root)).as_posix()
            version, writer = writes.get(rel, (0, "outside the log"))
            modified = datetime.fromtimestamp(stat.st_mtime, tz=UTC)
            found.append(WorkspaceFile(rel, stat.st_size, modified, version, writer))
            if len(found) >= MAX_FILES:
                return sorted(found, key=lambda f: f.name)
    return sorted(found, key=lambda f: f.name)
