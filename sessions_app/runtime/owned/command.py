"""The `command` kind: a supervised operating-system process.

- argv[0] must match one of the profile's `command_allow` glob patterns
  (none by default: nothing runs); refused before anything is admitted.
- It runs in its own session and process group (start_new_session), so a
  cancel, a timeout or a reaper kills the whole group, in the session's
  scratch directory of the session's documents (runtime/materialize.py,
  under `scratch_root()`; committed back when it ends), with a
  small environment of its own (never the worker's: no database URL, no
  secret key) that names its task, so a reaper on the host can find a group
  whose id was never recorded (a crash between the spawn and its record).
- Its stdout and stderr are read into a tail of TERRET_TASK_OUTPUT_BYTES;
  the tail is the progress while it runs, and with the exit code the outcome.
- Its supervisor renews the task's lease every TERRET_TASK_POLL_SECONDS and
  reads the abort intent in the same statement; a lost lease (taken over)
  kills the group and writes nothing more.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings

from sessions_app.errors import TaskRefused
from sessions_app.models import AgentProfile
from sessions_app.runtime import lifecycle
from sessions_app.runtime.materialize import materialized, scratch_root
from sessions_app.runtime.owned.kinds import TaskKind
from sessions_app.runtime.owned.supervision import Settlement, Supervision

NAME = "command"
VERSION = 1
MAX_ARGV = 256
MAX_ARG_CHARS = 8192
KILL_GRACE_SECONDS = 2.0
logger = logging.getLogger(__name__)
MARKER = "TERRET_TASK"  # the environment variable naming the task in every process of its group


class _Discard(Exception):
    """Leave the scratch directory without committing it (a cancelled or lost run)."""

    def __init__(self, settlement: Settlement) -> None:
        super().__init__(settlement.phase or "lost")
        self.settlement = settlement


def check(profile: AgentProfile, args: dict[str, Any]) -> dict[str, Any]:
    """The spec of a command the profile allows, or TaskRefused (nothing runs)."""
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise TaskRefused("a command needs argv: a non-empty list of strings")
    if len(argv) > MAX_ARGV or any(len(a) > MAX_ARG_CHARS or "\x00" in a for a in argv):
        raise TaskRefused(f"argv is too long (at most {MAX_ARGV} arguments of {MAX_ARG_CHARS} characters, no NUL)")
    patterns = [p for p in (profile.command_allow or []) if isinstance(p, str)]
    if not any(fnmatch.fnmatchcase(argv[0], p) for p in patterns):
        allowed = ", ".join(patterns) if patterns else "none"
        raise TaskRefused(
            f"refused: {argv[0]!r} is not allowed to run (the profile's command_allow patterns: {allowed}); "
            "nothing was started"
        )
    timeout = args.get("timeout_s", settings.TERRET_TASK_DEFAULT_SECONDS)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise TaskRefused("timeout_s must be a positive number of seconds")
    return {"argv": argv, "timeout_s": min(float(timeout), settings.TERRET_TASK_MAX_SECONDS)}


class _Tail:
    """The last `limit` bytes of a stream, read by a thread of its own."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.total = 0

    def read_from(self, stream: Any) -> None:
        for chunk in iter(lambda: stream.read1(4096), b""):
            with self.lock:
                self.total += len(chunk)
                self.buf += chunk
                if len(self.buf) > self.limit:
                    del self.buf[: len(self.buf) - self.limit]

    def text(self) -> str:
        with self.lock:
            return bytes(self.buf).decode("utf-8", "replace").replace("\x00", "\\0")


def kill_group(pgid: int | None) -> None:
    """SIGTERM to the group, then SIGKILL to whatever is left after a grace."""
    if not pgid or pgid <= 1:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_SECONDS
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie leader still answers: only a group with a live member counts.
    return any(_state(pid) not in ("Z", "X", "") for pid in _members(pgid))


def _members(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def _state(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def marked_groups(task_id: uuid.UUID | str) -> set[int]:
    """The process groups on this host whose processes carry the task's
    marker: what a reaper kills when no group id was recorded."""
    needle = f"{MARKER}={task_id}".encode()
    groups: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\x00"):
                groups.add(os.getpgid(int(entry.name)))
        except (OSError, ProcessLookupError):
            continue
    return groups


def reap(task_id: uuid.UUID | str, pgid: int | None) -> None:
    """Kill the task's process group (recorded or found by its marker)."""
    for group in {pgid, *marked_groups(task_id)}:
        kill_group(group)


def _env(task_id: uuid.UUID, cwd: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(cwd),
        "LANG": "C.UTF-8",
        MARKER: str(task_id),
    }


def run(sup: Supervision) -> Settlement:
    """Run the command in a scratch directory holding the session's documents
    (runtime/materialize.py): a command's world is the journal's, whichever
    host supervises it. What it changed is committed back as document
    versions when it ends (done, failed or timed out), before its receipt;
    a cancelled or lost run commits nothing."""
    task = sup.task
    try:
        with materialized(task.session_id, by=f"task:{task.id}", root=scratch_root()) as scratch:
            settlement = _run_in(sup, scratch.path)
            if settlement.phase in ("", "cancelled") or (settlement.reason or {}).get("code") == "supervisor_lost":
                raise _Discard(settlement)
    except _Discard as discarded:
        return discarded.settlement
    if scratch.outcome.conflicts or scratch.outcome.refused:
        logger.warning("task %s: documents not committed: %s", task.id, scratch.outcome)
    return settlement


def _run_in(sup: Supervision, cwd: Path) -> Settlement:
    task = sup.task
    argv = list(task.spec.get("argv") or [])
    timeout = float(task.spec.get("timeout_s") or settings.TERRET_TASK_DEFAULT_SECONDS)
    # The intent first: a reaper after a crash here looks for the marker.
    if not sup.checkpoint({"spawning": True}):
        return Settlement.lost()
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=_env(task.id, cwd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a cancel or a timeout kills all of it
        )
    except OSError as exc:
        return Settlement("failed", {"exit_code": None, "output": ""}, {"code": "spawn_failed", "message": str(exc)})
    pgid = proc.pid
    if not sup.record_process(pgid, {"spawned": True, "pid": proc.pid}):
        kill_group(pgid)  # taken over between the spawn and its record: not ours to run
        return Settlement.lost()
    tail = _Tail(settings.TERRET_TASK_OUTPUT_BYTES)
    reader = threading.Thread(target=tail.read_from, args=(proc.stdout,), name=f"task-{task.id}-out", daemon=True)
    reader.start()
    started = time.monotonic()
    try:
        while True:
            code = proc.poll()
            if code is not None:
                break
            renewal = sup.renew(tail.text())
            if not renewal.held:
                kill_group(pgid)
                return Settlement.lost()
            if renewal.abort:
                kill_group(pgid)
                proc.wait()
                return Settlement("cancelled", _outcome(proc.returncode, tail), {"code": "cancelled"})
            if time.monotonic() - started > timeout:
                kill_group(pgid)
                proc.wait()
                reason = {"code": "timeout", "timeout_s": timeout}
                return Settlement("failed", _outcome(proc.returncode, tail), reason)
            if lifecycle.draining.is_set():
                kill_group(pgid)
                proc.wait()
                return Settlement("failed", _outcome(proc.returncode, tail), {"code": "supervisor_lost"})
            sup.progress(tail.text(), time.monotonic() - started)
            time.sleep(settings.TERRET_TASK_POLL_SECONDS)
    finally:
        kill_group(pgid)  # whatever the leader left behind in its group: never running unowned
        reader.join(timeout=1.0)
    outcome = _outcome(code, tail)
    if code == 0:
        return Settlement("done", outcome, None)
    return Settlement("failed", outcome, {"code": "exit_code", "exit_code": code})


def _outcome(code: int | None, tail: _Tail) -> dict[str, Any]:
    return {"exit_code": code, "output": tail.text()}


KIND = TaskKind(NAME, VERSION, run, rerunnable=False)
