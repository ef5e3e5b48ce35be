"""Code versions: which build a worker runs, which event versions it reads,
and leaving a session whose log it cannot read.

Every event kind has a schema version (catalogue.Kind.version) and every
event stores the version it was written with; a session keeps the newest
version written per kind above 1 (Session.event_versions, kept by the
append itself). A claim reads that column with the lease, so the check costs
no query: a worker whose catalogue reads an older version of some kind in
the log leaves the session without driving it (drive.py). If a live worker
of newer code can read it, the drive is handed off (the task sends the
wake-up again, for another worker); if none can, the open turn is blocked
`unsupported_version`, naming "event:<kind>@<version>", and waits, whole,
for a worker that can: the sweep of a worker that reads it asks the turn
to be driven again (readable_again), so a deploy that brings one needs no
operator. Nothing is read wrongly,
skipped or dropped.

Each worker records its build and its catalogue's versions in its
WorkerProcess row (liveness.py registers it), which is how a worker knows
whether another one can read a log.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import tomllib
import uuid
from dataclasses import replace
from importlib import metadata
from typing import Any

from django.conf import settings

from sessions_app import log
from sessions_app.log import catalogue
from sessions_app.models import Event, Session, WorkerProcess
from sessions_app.runtime import failures

logger = logging.getLogger(__name__)

# Test-only: {kind: version} this process's catalogue takes instead of its
# own, to play an older or newer release (honoured only under TESTING).
TEST_VERSIONS_ENV = "TERRET_TEST_EVENT_VERSIONS"
BUILD_ENV = "TERRET_BUILD"


@functools.cache
def build() -> str:
    """This code's build, read once: the package version, plus the git
    commit (TERRET_BUILD when set, else `git rev-parse HEAD` when the code
    sits in a git checkout)."""
    version = _package_version()
    commit = os.environ.get(BUILD_ENV, "").strip() or _git_commit()
    return f"{version}+{commit}"[:200] if commit else version


def _package_version() -> str:
    """The installed package's version, else pyproject.toml's (a checkout run in place)."""
    try:
        return metadata.version("terret")
    except metadata.PackageNotFoundError:
        pass
    try:
        with (settings.BASE_DIR / "pyproject.toml").open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def _git_commit() -> str:
    base = settings.BASE_DIR
    if not (base / ".git").exists():
        return ""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=base,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def apply_test_versions() -> None:
    """Under TESTING only: take TERRET_TEST_EVENT_VERSIONS's versions into
    the catalogue (this process then writes and reads them)."""
    raw = os.environ.get(TEST_VERSIONS_ENV, "")
    if not raw or not settings.TESTING:
        return
    for kind, version in json.loads(raw).items():
        catalogue.CATALOGUE[kind] = replace(catalogue.CATALOGUE[kind], version=int(version))


def registration() -> tuple[str, str]:
    """What the WorkerProcess row records: (build, the event versions it reads as JSON)."""
    return build(), json.dumps(catalogue.versions(), separators=(",", ":"), sort_keys=True)


def written_versions(value: dict[str, Any] | str | None) -> dict[str, int] | None:
    """Session.event_versions as a claim's row holds it (SQLite hands the JSON back as text)."""
    found: dict[str, Any] | None = json.loads(value) if isinstance(value, str) else value
    return {str(k): int(v) for k, v in found.items()} if found else None


def unreadable(written: dict[str, Any] | str | None) -> str | None:
    """ "event:<kind>@<version>" for a version in the log this code cannot read; None: it reads them all."""
    return catalogue.unreadable(written_versions(written))


def capable_worker(written: dict[str, Any] | str | None) -> bool:
    """Whether some live worker process reads every version in `written`."""
    versions = written_versions(written)
    reads = WorkerProcess.objects.values_list("event_versions", flat=True)
    return any(catalogue.unreadable(versions, dict(r or {})) is None for r in reads)


def block(session_id: uuid.UUID, fence: log.Fence, what: str) -> None:
    """Block the open turn `unsupported_version` (the drive then releases the lease)."""
    reason = f"no live worker reads {what.removeprefix('event:')}: this one runs {build()}"
    data = {"reason": reason, "attempts": 0, "code": failures.UNSUPPORTED_VERSION, "what": what}
    log.append(session_id, "turn/blocked", data, fence=fence)


# Blocked turns are few; a bounded batch per sweep round is plenty.
READABLE_BATCH = 100


def readable_again() -> list[str]:
    """Open turns blocked `unsupported_version` whose log this worker now
    reads: each gets turn/retry_requested (by this build) and is returned to
    be woken. The check runs in the worker that will drive it, so "a live
    worker reads it" is certain, not inferred from another's row."""
    blocked = Session.objects.filter(open_turn_seq__isnull=False, blocked_seq__isnull=False)
    rows = list(blocked.values_list("id", "blocked_seq", "event_versions")[:READABLE_BATCH])
    woken: list[str] = []
    for sid, blocked_seq, written in rows:
        if blocked_seq is None or unreadable(written) is not None:
            continue
        code = Event.objects.filter(session_id=sid, seq=blocked_seq).values_list("data__code", flat=True).first()
        if code != failures.UNSUPPORTED_VERSION:
            continue
        with log.locked(sid) as tx:
            if tx.row["blocked_seq"] != blocked_seq:
                continue  # someone retried, cancelled or abandoned it meanwhile
            reason = f"a worker that reads its log is live: {build()}"
            tx.append("turn/retry_requested", {"by": f"worker:{build()}", "reason": reason})
        woken.append(str(sid))
    return woken
