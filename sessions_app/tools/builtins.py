"""Built-in tools: the clock, a per-session workspace sandbox, and debug aids.

Each says what a resume may do with an attempt of it that has no recorded
outcome (Definition.replay_policy): the read-only ones and debug.sleep are
safe to run again; workspace.write reconciles, by comparing the file with
the content it was asked to write; debug.charge (an effect for tests and
demos, deliberately never replayed) waits for an operator.

The workspace tools take paths from the model, so every path is treated as
hostile: it must be relative, free of `..` and NUL, and must still lie inside
the session's directory after symlinks are resolved. Files are opened with
O_NOFOLLOW so a symlink swapped in after the check is not followed either.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from .base import Definition, Reconciliation, ToolContext, ToolError
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


# -- sandbox ---------------------------------------------------------------


def _root(ctx: ToolContext) -> Path:
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    return ctx.workspace.resolve(strict=True)


def _relative(path: Any) -> PurePosixPath:
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
    return rel


def _resolve(ctx: ToolContext, path: Any) -> tuple[Path, Path]:
    """The workspace root and the target, both with symlinks resolved."""
    root = _root(ctx)
    try:
        target = (root / _relative(path)).resolve(strict=False)
    except (OSError, RuntimeError):  # symlink loops; RuntimeError before 3.13
        raise ToolError("path cannot be resolved") from None
    if target == root or not target.is_relative_to(root):
        raise ToolError("path escapes the workspace")
    return root, target


def _read(ctx: ToolContext, args: dict[str, Any]) -> str:
    _, target = _resolve(ctx, args.get("path"))
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ToolError(f"no such file: {args['path']}") from None
    except OSError as exc:
        raise ToolError(f"cannot open {args['path']}: {exc.strerror}") from None
    try:
        data = _read_regular(fd, args["path"])
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{args['path']} is not UTF-8 text") from None


def _read_regular(fd: int, path: str) -> bytes:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{path} is not a regular file")
    if info.st_size > MAX_READ_BYTES:
        raise ToolError(f"{path} is {info.st_size} bytes; the read limit is {MAX_READ_BYTES}")
    chunks, size = [], 0
    while size <= MAX_READ_BYTES and (chunk := os.read(fd, MAX_READ_BYTES + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
    if size > MAX_READ_BYTES:  # it grew after the fstat
        raise ToolError(f"{path} is larger than the read limit of {MAX_READ_BYTES} bytes")
    return b"".join(chunks)


def _write(ctx: ToolContext, args: dict[str, Any]) -> str:
    content = args.get("content")
    if not isinstance(content, str):
        raise ToolError("content must be a string")
    data = content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise ToolError(f"content is {len(data)} bytes; the write limit is {MAX_WRITE_BYTES}")
    root, target = _resolve(ctx, args.get("path"))
    _make_parents(root, target.parent)
    if target.is_dir():
        raise ToolError(f"{args['path']} is a directory")
    _replace(target, data)
    return f"wrote {len(data)} bytes to {target.relative_to(root).as_posix()}"


def _reconcile_write(ctx: ToolContext, args: dict[str, Any]) -> Reconciliation:
    """Done if the file holds exactly the content the attempt was to write
    (compared by hash); otherwise not done, and the write runs again. A path
    the write would refuse is not done either: running it gives the error."""
    content = args.get("content")
    if not isinstance(content, str):
        return Reconciliation("not_done")
    try:
        root, target = _resolve(ctx, args.get("path"))
        current = target.read_bytes() if target.is_file() and not target.is_symlink() else None
    except (ToolError, OSError):
        return Reconciliation("not_done")
    data = content.encode("utf-8")
    if current is None or hashlib.sha256(current).digest() != hashlib.sha256(data).digest():
        return Reconciliation("not_done")
    return Reconciliation("done", f"wrote {len(data)} bytes to {target.relative_to(root).as_posix()}")


def _make_parents(root: Path, parent: Path) -> None:
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ToolError("a parent of the path is a file, not a directory") from None
    # mkdir may have walked through a symlink created after _resolve looked.
    if not parent.resolve(strict=True).is_relative_to(root):
        raise ToolError("path escapes the workspace")


def _replace(target: Path, data: bytes) -> None:
    # Write-then-rename: a crash mid-write leaves the old file, never half a
    # new one, which is what makes a re-run after a crash safe. os.replace
    # swaps a symlink at `target` out rather than writing through it.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".terret-write-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _list(ctx: ToolContext, args: dict[str, Any]) -> str:
    root = _root(ctx)
    lines: list[str] = []
    for current, dirs, files in os.walk(root):  # does not descend into symlinked dirs
        dirs.sort()
        base = Path(current)
        for name in sorted(files) + [d for d in dirs if (base / d).is_symlink()]:
            lines.append(_entry(root, base / name))
            if len(lines) >= MAX_LIST_ENTRIES:
                return "\n".join([*lines, f"[listing stopped at {MAX_LIST_ENTRIES} entries]"])
    return "\n".join(lines) if lines else "(workspace is empty)"


def _entry(root: Path, path: Path) -> str:
    rel = path.relative_to(root).as_posix()
    if path.is_symlink():
        return f"{rel} (symlink)"
    return f"{rel} ({path.lstat().st_size} bytes)"


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
        *TASK_TOOLS,
    )
}
