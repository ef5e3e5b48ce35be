"""The previous release, as a code tree of its own, for the rolling-deploy
drill (tests/chaos/test_rolling_deploy.py).

The tree is a detached `git worktree` of this checkout's HEAD, with a
small patch that takes back what the release at HEAD changed:

- session/upgraded at event version 1, bare version numbers (HEAD writes
  version 2, {number, digest}, and lifts version 1 through its upcaster);
- a built-in tool, clock.today, that HEAD no longer has.

Its processes run with the tree as their working directory and
PYTHONPATH: their own code, against the stack's PostgreSQL and Redis. The
patch appends to three modules (rebinding names at their end), so it
applies whatever else changed above it; a module that lost what it
rebinds fails the old release's start, loudly.

Without git (a source archive, not a clone) the tree is a copy of the
working tree, and the drill says so in its figures.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.stack import ROOT

DROPPED_TOOL = "clock.today"  # the previous release's, gone from HEAD

PATCH: dict[str, str] = {
    "sessions_app/log/catalogue.py": """

# -- the previous release (tests/chaos/releases.py) ------------------------------
CATALOGUE["session/upgraded"] = Kind(
    "session/upgraded",
    _obj({"from": {"type": ["integer", "null"]}, "to": _SEQ, "by": _NONEMPTY}, ["from", "to", "by"]),
    False,
    "The session moves from agent version `from` to `to` (event version 1: bare numbers).",
    lambda d: [("agent_version = %s", [d["to"]])],
)
""",
    "sessions_app/runtime/versions.py": """

# -- the previous release (tests/chaos/releases.py) ------------------------------
def upgraded(profile_id, previous, target, by):  # type: ignore[no-untyped-def]
    return {"from": previous, "to": target.number, "by": by}
""",
    "sessions_app/tools/builtins.py": f'''

# -- the previous release (tests/chaos/releases.py) ------------------------------
BUILTINS["{DROPPED_TOOL}"] = Definition(
    "{DROPPED_TOOL}",
    "Today's date (UTC), ISO 8601.",
    NO_ARGS,
    lambda ctx, args: datetime.now(UTC).date().isoformat(),
    in_process=True,
    fast=True,
)
''',
}


@dataclass
class Release:
    """A code tree of the previous release: `how` says how it was built."""

    root: Path
    how: str
    commit: str

    def remove(self) -> None:
        if self.how == "git worktree":
            subprocess.run(["git", "worktree", "remove", "--force", str(self.root)], cwd=ROOT, check=False)
            subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise OSError(done.stderr.strip() or f"git {' '.join(args)} failed")
    return done.stdout.strip()


def build_previous(into: Path) -> Release:
    """The previous release's tree at `into` (which must not exist)."""
    try:
        commit = _git("rev-parse", "--short=12", "HEAD")
        _git("worktree", "add", "--detach", str(into), "HEAD")
        release = Release(into, "git worktree", commit)
    except OSError as exc:
        print(f"[chaos] rolling deploy: no git checkout ({exc}): the previous release is a copy", flush=True)
        ignore = shutil.ignore_patterns(".git", ".venv", "node_modules", "var", ".next", "__pycache__")
        shutil.copytree(ROOT, into, ignore=ignore)
        release = Release(into, "copy", "none")
    for path, text in PATCH.items():
        with (into / path).open("a") as f:
            f.write(text)
    return release
