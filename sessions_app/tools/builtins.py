"""Built-in tools: the clock, the session's workspace, and debug aids.

Each says what a resume may do with an attempt of it that has no recorded
outcome (Definition.replay_policy): the read-only ones and debug.sleep are
safe to run again; workspace.write reconciles, by comparing the file with
the content it was asked to write; debug.charge (an effect for tests and
demos, deliberately never replayed) waits for an operator.

The workspace is the session's documents (runtime/documents.py, reached
through tools/documents.py), not a directory: every worker on every host
sees the same files, and every write is a committed version logged as
document/written, fenced on the turn's lease. Paths come from the model, so
each must be relative and free of `..` and NUL; it names a document, never
a place on a disk. debug.charge alone keeps a local file (charges.log, in
TERRET_WORKSPACE_ROOT/<session>): it stands for an external system's record
of effects, which is not the agent's world.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from sessions_app.errors import TerretError

from . import documents
from .base import Definition, Reconciliation, ToolContext, ToolError
from .monitors import DEFINITIONS as MONITOR_TOOLS
from .schedules import DEFINITIONS as SCHEDULE_TOOLS
from .tasks import DEFINITIONS as TASK_TOOLS

MAX_READ_BYTES = 256 * 1024
MAX_WRITE_BYTES = 256 * 1024
MAX_PATH_CHARS = 1024
MAX_LIST_ENTRIES = 1000
MAX_SLEEP_SECONDS = 600
MAX_CHARGE_WAIT_SECONDS = 30
CHARGES_FILE = "charges.log"


def workspace_dir(session_id: uuid.UUID) -> Path:
    """Where a session's workspace lives (not created here)."""
    return Path(settings.TERRET_WORKSPACE_ROOT) / session_id.hex


def context_for(session_id: uuid.UUID, call_id: str) -> ToolContext:
    return ToolContext(session_id=session_id, call_id=call_id, workspace=workspace_dir(session_id))


# -- the workspace: the session's documents --------------------------------


def _root(ctx: ToolContext) -> Path:
    """debug.charge's local directory (it stands for an external system)."""
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    return ctx.workspace.resolve(strict=True)


def _relative(path: Any) -> str:
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string")
    if "\x00" in path:
        raise ToolError("path must not contain NUL bytes")
    if len(path) > MAX_PATH_CHARS:
        raise ToolError(f"path is longer than {MAX_PATH_CHARS} characters")
    rel = PurePosixPath(path)
    if rel.is_absolute():
        raise ToolError("path must be relative to the workspace")
    if ".." in rel.parts:
        raise ToolError("path must not contain '..'")
    if rel.parts in ((), (".",)):
        raise ToolError("path must name a file inside the workspace")
    return rel.as_posix()


def _read(ctx: ToolContext, args: dict[str, Any]) -> str:
    name = _relative(args.get("path"))
    data = documents.store().read(ctx.session_id, name)
    if data is None:
        raise ToolError(f"no such file: {args['path']}")
    if len(data) > MAX_READ_BYTES:
        raise ToolError(f"{args['path']} is {len(data)} bytes; the read limit is {MAX_READ_BYTES}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{args['path']} is not UTF-8 text") from None


def _write(ctx: ToolContext, args: dict[str, Any]) -> str:
    content = args.get("content")
    if not isinstance(content, str):
        raise ToolError("content must be a string")
    data = content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise ToolError(f"content is {len(data)} bytes; the write limit is {MAX_WRITE_BYTES}")
    name = _relative(args.get("path"))
    try:
        written = documents.store().write(ctx.session_id, name, data, fence=ctx.fence, call_id=ctx.call_id)
    except TerretError as exc:  # a bound, a path that is a directory: the model reads why
        raise ToolError(str(exc)) from exc
    return f"wrote {len(data)} bytes to {written}"


def _reconcile_write(ctx: ToolContext, args: dict[str, Any]) -> Reconciliation:
    """Done if the document's head holds exactly the content the attempt was
    to write (compared by hash); otherwise not done, and the write runs
    again. A path the write would refuse is not done either: running it
    gives the error."""
    content = args.get("content")
    if not isinstance(content, str):
        return Reconciliation("not_done")
    try:
        name = _relative(args.get("path"))
    except ToolError:
        return Reconciliation("not_done")
    data = content.encode("utf-8")
    if documents.store().digest(ctx.session_id, name) != hashlib.sha256(data).hexdigest():
        return Reconciliation("not_done")
    return Reconciliation("done", f"wrote {len(data)} bytes to {name}")


def _list(ctx: ToolContext, args: dict[str, Any]) -> str:
    entries = documents.store().list(ctx.session_id, MAX_LIST_ENTRIES + 1)
    lines = [f"{name} ({size} bytes)" for name, size in entries[:MAX_LIST_ENTRIES]]
    if len(entries) > MAX_LIST_ENTRIES:
        lines.append(f"[listing stopped at {MAX_LIST_ENTRIES} entries]")
    return "\n".join(lines) if lines else "(workspace is empty)"


# -- the rest --------------------------------------------------------------


def _now(ctx: ToolContext, args: dict[str, Any]) -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _noop(ctx: ToolContext, args: dict[str, Any]) -> str:
    return "ok"


def _sleep(ctx: ToolContext, args: dict[str, Any]) -> str:
    seconds = args.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= MAX_SLEEP_SECONDS:
        raise ToolError(f"seconds must be a number from 0 to {MAX_SLEEP_SECONDS}")
    time.sleep(seconds)
    return f"slept {seconds:g}"


def _charge(ctx: ToolContext, args: dict[str, Any]) -> str:
    """Wait, then append one line to charges.log: one line per execution,
    so a test counts executions at the target, not results in the log."""
    seconds = args.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= MAX_CHARGE_WAIT_SECONDS:
        raise ToolError(f"seconds must be a number from 0 to {MAX_CHARGE_WAIT_SECONDS}")
    time.sleep(seconds)
    root = _root(ctx)
    line = {
        "call_id": ctx.call_id,
        "idempotency_key": ctx.idempotency_key,
        "attempt": ctx.attempt,
        "at": datetime.now(UTC).isoformat(),
    }
    fd = os.open(root / CHARGES_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"charged (attempt {ctx.attempt}, key {ctx.idempotency_key})"


NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
_PATH = {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS, "description": "Path relative to the workspace"}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


BUILTINS: dict[str, Definition] = {
    d.name: d
    for d in (
        Definition("clock.now", "The current UTC time in ISO 8601.", NO_ARGS, _now, in_process=True, fast=True),
        Definition(
            "workspace.read",
            f"Read a UTF-8 text file from this session's workspace (at most {MAX_READ_BYTES // 1024} KiB).",
            _object({"path": _PATH}),
            _read,
            in_process=True,
            fast=True,
        ),
        Definition(
            "workspace.write",
            "Create or replace a UTF-8 text file in this session's workspace; parent directories are created "
            f"(at most {MAX_WRITE_BYTES // 1024} KiB).",
            _object({"path": _PATH, "content": {"type": "string"}}),
            _write,
            approval="policy",
            mutating=True,
            idempotent=True,
            in_process=True,
            replay="reconcile",
            reconcile=_reconcile_write,
        ),
        Definition(
            "workspace.list",
            "List the files in this session's workspace with their sizes.",
            NO_ARGS,
            _list,
            in_process=True,
            fast=True,
        ),
        Definition("debug.noop", "Do nothing and answer 'ok'.", NO_ARGS, _noop, in_process=True, fast=True),
        Definition(
            "debug.sleep",
            f"Sleep for the given number of seconds (at most {MAX_SLEEP_SECONDS}).",
            _object({"seconds": {"type": "number", "minimum": 0, "maximum": MAX_SLEEP_SECONDS}}),
            _sleep,
            in_process=True,
            replay="safe",
        ),
        Definition(
            "debug.charge",
            f"Record a charge: wait `seconds` (0 to {MAX_CHARGE_WAIT_SECONDS}, default 0), then append one line to "
            f"{CHARGES_FILE} in the workspace. An effect that is never re-run by itself after a crash.",
            {
                "type": "object",
                "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": MAX_CHARGE_WAIT_SECONDS}},
                "additionalProperties": False,
            },
            _charge,
            mutating=True,
            idempotent=False,
            in_process=True,
            replay="never",
        ),
        *SCHEDULE_TOOLS,
        *MONITOR_TOOLS,
        *TASK_TOOLS,
    )
}
