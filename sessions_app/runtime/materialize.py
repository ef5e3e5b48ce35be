"""A session's documents as a real directory, for programs that need one.

A program that reads and writes files (a `command` task, an MCP server such
as server-filesystem) runs in a scratch directory that holds the session's
documents; what it changes there is committed back as document versions
when it ends, or at a checkpoint, with the usual fences. So a command's
world is the journal's world: any worker on any host sees what it wrote.

    from sessions_app.runtime.materialize import materialized

    with materialized(session_id, fence=lease.fence, by="command") as scratch:
        subprocess.run(argv, cwd=scratch.path, check=False)
        scratch.checkpoint()  # optional: commit what is there so far
    # on leaving: changes committed (scratch.outcome), the directory removed

Committing compares each file with the version it was materialized from
(or last committed at a checkpoint):

- a changed file is written through a handle naming that incarnation and
  version, so a document written or recreated meanwhile by anyone else is a
  conflict (left as it is, named in `Outcome.conflicts` once, and not
  tried again by later commits), never clobbered;
- a new file is a new document (conversation scope), unless a document of
  that name appeared meanwhile (a conflict again);
- a file removed from the directory retires its document (same handle);
- symlinks and anything but regular files are ignored; a file a bound or
  the path rules refuse is named in `Outcome.refused` with the reason.

Every write is fenced on `fence` when given: a program that outlives its
lease commits nothing (LeaseLost propagates). An exception inside the block
commits nothing unless `commit_on_error` is set; the directory is removed
either way. Task-scoped documents are materialized only for their own
`task`.

A long-lived program (an MCP server, tools/mcp.py) keeps its directory
across many calls: `open_scratch` makes one, `refresh()` brings it to the
documents' heads before each call (another host may have written since),
`checkpoint()` commits after it, and `remove()` ends it.

A process killed while it held a directory (kill -9, a lost host power
supply) never removes it, and it holds copies of a session's documents. So
each directory is named after its process's owner token: a lock file under
the same root that the process holds (flock) for as long as it lives; the
operating system drops the lock at any exit. Every worker's sweep
(`sweep_orphans`, runtime/sweep.py) removes the directories of a token whose
lock it can take, and the lock file with them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from sessions_app import log
from sessions_app.errors import DocumentConflict, TerretError
from sessions_app.tools import documents as tool_documents

from . import documents, hooks

try:
    import fcntl
except ImportError:  # not POSIX: no owner tokens, and nothing is swept
    fcntl = None  # type: ignore[assignment]

SCRATCH_PREFIX = "terret-docs-"
OWNER_PREFIX = ".terret-owner-"
logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What the commits so far did, by document name."""

    written: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Scratch:
    """The materialized directory of one session's documents."""

    session_id: uuid.UUID
    path: Path
    fence: log.Fence | None
    by: str
    base: dict[str, documents.Info]
    outcome: Outcome = field(default_factory=Outcome)
    task: str = ""

    def checkpoint(self) -> Outcome:
        """Commit what the directory holds now (see the module docstring);
        later commits compare with what this one left."""
        found = files_under(self.path)
        settled = set(self.outcome.conflicts)  # a conflict is reported once, then left alone
        for name, path in sorted(found.items()):
            if name not in settled:
                self._commit_file(name, path)
        for name in sorted(set(self.base) - set(found) - settled):
            self._retire(name)
        return self.outcome

    def refresh(self) -> None:
        """Make the directory's files exactly the documents' heads: a file whose
        content differs from its head is written again, any other (a file no
        document names, a symlink, a special file) is removed. What an
        earlier commit left uncommitted (a conflict, a refused file) is gone
        then, and the outcome starts afresh."""
        heads = {i.name: i for i in _visible(self.session_id, self.task)}
        _prune(self.path, keep=set(heads))
        for name, info in heads.items():
            target = self.path / name
            if target.is_file() and _digest(target) == info.sha256:
                continue
            _put(self.session_id, self.path, info)
        self.base, self.outcome = heads, Outcome()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def _commit_file(self, name: str, path: Path) -> None:
        data = path.read_bytes()
        known = self.base.get(name)
        if known is not None and hashlib.sha256(data).hexdigest() == known.sha256:
            return
        expect = None if known is None else documents.Handle(self.session_id, name, known.incarnation, known.version)
        try:
            if known is None and documents.head_digest(self.session_id, name) is not None:
                raise DocumentConflict(f"{name}: a document of that name was written meanwhile")
            info = documents.write(self.session_id, name, data, by=self.by, fence=self.fence, expect=expect)
        except DocumentConflict:
            self.outcome.conflicts.append(name)
            return
        except TerretError as exc:
            self.outcome.refused.append((name, str(exc)))
            return
        self.base[info.name] = info
        self.outcome.written.append(info.name)

    def _retire(self, name: str) -> None:
        known = self.base[name]
        try:
            documents.retire(
                self.session_id,
                name,
                by=self.by,
                fence=self.fence,
                expect=documents.Handle(self.session_id, name, known.incarnation, known.version),
            )
        except DocumentConflict:
            self.outcome.conflicts.append(name)
            return
        except TerretError as exc:
            self.outcome.refused.append((name, str(exc)))
            return
        del self.base[name]
        self.outcome.retired.append(name)


def files_under(root: Path) -> dict[str, Path]:
    """The regular files under root by relative POSIX path (no symlink followed)."""
    found: dict[str, Path] = {}
    for current, dirs, files in os.walk(root):  # does not descend into symlinked dirs
        base = Path(current)
        for name in files:
            path = base / name
            if path.is_symlink() or not path.is_file():
                continue
            found[path.relative_to(root).as_posix()] = path
        dirs[:] = [d for d in dirs if not (base / d).is_symlink()]
    return found


def write_out(session_id: uuid.UUID, dest: Path, *, task: str = "") -> dict[str, documents.Info]:
    """Write the session's live documents into `dest`; what was written, by name."""
    base: dict[str, documents.Info] = {}
    for info in _visible(session_id, task):
        _put(session_id, dest, info)
        base[info.name] = info
    return base


def _visible(session_id: uuid.UUID, task: str) -> list[documents.Info]:
    """The live documents a directory holds: task-scoped ones only for their own task."""
    return [i for i in documents.listing(session_id) if i.scope != "task" or i.task == task]


def _put(session_id: uuid.UUID, dest: Path, info: documents.Info) -> None:
    target = dest / info.name
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)  # a directory left where a document now is
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(documents.read(session_id, info.name, version=info.version).data)


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _prune(root: Path, keep: set[str]) -> None:
    """Remove every file under root but the regular files named in `keep`;
    symlinks are removed, never followed. Directories stay: a program may
    make one in one call and write into it in the next (a directory is no
    document, so another host's copy does not have it)."""
    for current, dirs, files in os.walk(root):
        base = Path(current)
        for name in [*files, *dirs]:
            path = base / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                path.unlink(missing_ok=True)
            elif path.is_file() and path.relative_to(root).as_posix() not in keep:
                path.unlink()


def scratch_root() -> Path:
    """Where this host makes a scratch directory (a `command` task's, an MCP
    server's): under its TERRET_WORKSPACE_ROOT. The one place that says so."""
    root = Path(settings.TERRET_WORKSPACE_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    return root


_owners: dict[tuple[str, int], str] = {}  # (root, pid) -> this process's token there
_owners_lock = threading.Lock()


def owner_token(root: Path) -> str:
    """This process's owner token under `root` (see the module docstring):
    its lock file is made under a temporary name, locked, then renamed, so a
    sweep never finds an owner's file unlocked while the owner lives. A
    forked child makes its own (its pid differs)."""
    key = (str(root), os.getpid())
    with _owners_lock:
        token = _owners.get(key)
        if token is None:
            token = uuid.uuid4().hex[:12]
            if fcntl is not None:
                making = root / f".{token}.making"
                fd = os.open(making, os.O_CREAT | os.O_RDWR, 0o600)  # kept open: the lock lives with it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.replace(making, root / f"{OWNER_PREFIX}{token}")
            _owners[key] = token
        return token


def empty_scratch(purpose: str) -> Path:
    """An empty directory of this process's under the host's scratch root
    (an MCP workspace server's tool listing runs in one), named after its
    owner token like a session's, so `sweep_orphans` removes a killed one."""
    root = scratch_root()
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{purpose}-{owner_token(root)}-", dir=root))


def sweep_orphans(root: Path | None = None) -> int:
    """Remove the scratch directories of processes gone from this host (their
    owner token's lock is free) and their lock files; how many directories.
    A live owner's lock, this process's own included, cannot be taken."""
    root = Path(root or settings.TERRET_WORKSPACE_ROOT)
    if fcntl is None or not root.is_dir():
        return 0
    removed = 0
    for lock in root.glob(f"{OWNER_PREFIX}*"):
        token = lock.name.removeprefix(OWNER_PREFIX)
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:  # another sweep took it
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # its owner lives
            continue
        try:
            for path in root.glob(f"{SCRATCH_PREFIX}*-{token}-*"):
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
    if removed:
        logger.warning("removed %d scratch directories of processes gone from this host", removed)
    return removed


def open_scratch(
    session_id: uuid.UUID,
    *,
    fence: log.Fence | None = None,
    by: str = "program",
    root: Path | None = None,
    task: str = "",
) -> Scratch:
    """A new scratch directory holding the session's documents (under
    `root`, or the system's temporary directory); the caller removes it."""
    where = Path(root or tempfile.gettempdir())
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{session_id.hex[:12]}-{owner_token(where)}-", dir=where))
    try:
        return Scratch(session_id, path, fence, by, write_out(session_id, path, task=task), task=task)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


@contextmanager
def materialized(
    session_id: uuid.UUID,
    *,
    fence: log.Fence | None = None,
    by: str = "program",
    root: Path | None = None,
    task: str = "",
    commit_on_error: bool = False,
) -> Iterator[Scratch]:
    """A scratch directory holding the session's documents (under `root`,
    or the system's temporary directory), committed back on leaving."""
    scratch = open_scratch(session_id, fence=fence, by=by, root=root, task=task)
    try:
        try:
            yield scratch
        except BaseException:
            if commit_on_error:
                scratch.checkpoint()
            raise
        scratch.checkpoint()
    finally:
        scratch.remove()


class ToolDirectory:
    """A scratch directory as tools/documents.Directory: what an MCP server
    with `"workspace": true` works in (tools/mcp.py), under this host's
    scratch root; each commit fenced on the calling tool's lease."""

    def __init__(self, session_id: uuid.UUID, by: str) -> None:
        self.scratch = open_scratch(session_id, by=by, root=scratch_root())

    @property
    def path(self) -> Path:
        return self.scratch.path

    def refresh(self) -> None:
        self.scratch.refresh()

    def commit(self, fence: int) -> list[str]:
        self.scratch.fence = documents.fence_of(fence)
        outcome = self.scratch.checkpoint()  # LeaseLost propagates: a lost lease commits nothing
        problems = [f"{name} was not saved: {reason}" for name, reason in outcome.refused]
        problems += [
            f"{name} was not saved: its document was written meanwhile by someone else, and is kept as it was"
            for name in outcome.conflicts
        ]
        return problems

    def remove(self) -> None:
        self.scratch.remove()


def close_idle_workspaces() -> int:
    """On every worker's clock: MCP workspace servers idle too long closed,
    their directories removed (tools/mcp.py). Looked up, not imported: the
    MCP SDK costs a worker half a second to import, and a process that never
    imported it runs no server."""
    mcp = sys.modules.get("sessions_app.tools.mcp")
    # The module is listed while another thread (the worker's warm-up) still
    # runs its import: its function is not there yet, and nothing to close.
    close = getattr(mcp, "close_idle_workspaces", None)
    return int(close()) if close is not None else 0


def register_tools() -> None:
    tool_documents.register_directories(ToolDirectory, empty_scratch)
    hooks.register_clock(close_idle_workspaces)
