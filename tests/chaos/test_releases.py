"""The rolling-deploy drill's previous release (tests/chaos/releases.py),
checked in the ordinary passes: the patch still applies to this tree, and
the tree it builds loads as its own code in a process of its own, with
session/upgraded at event version 1 and clock.today, where this code has
version 2 and no clock.today. A change that breaks the patch fails here,
not only in the chaos pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sessions_app.log import catalogue
from sessions_app.tools.builtins import BUILTINS
from tests.chaos import releases

PROBE = (
    "import json, django; django.setup(); "
    "from sessions_app.log import catalogue, upcasters; from sessions_app.runtime import versions; "
    "from sessions_app.tools.builtins import BUILTINS; "
    "print(json.dumps({'root': str(__import__('sessions_app').__file__), "
    "'upgraded': catalogue.CATALOGUE['session/upgraded'].version, 'tool': 'clock.today' in BUILTINS, "
    "'payload': versions.upgraded(1, 1, versions.Version(1, 2, 'd', {}), 'policy')}))"
)


def load(tree: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree), "DJANGO_SETTINGS_MODULE": "terret_site.settings"}
    env.setdefault("SECRET_KEY", "x")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tree, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_new_release_is_this_tree() -> None:
    assert catalogue.CATALOGUE["session/upgraded"].version == 2
    assert releases.DROPPED_TOOL not in BUILTINS


def test_the_previous_release_is_a_worktree_of_head_with_its_own_code(tmp_path: Path) -> None:
    release = releases.build_previous(tmp_path / "previous")
    try:
        if release.how != "git worktree":
            pytest.skip("no git checkout here: the drill falls back to a copy (tested below)")
        assert (release.root / ".git").is_file()  # a linked worktree, detached at HEAD
        found = load(release.root)
        assert found["root"] == str(release.root / "sessions_app" / "__init__.py")
        assert found["upgraded"] == 1 and found["tool"] is True
        assert found["payload"] == {"from": 1, "to": 2, "by": "policy"}  # version 1's bare numbers
    finally:
        release.remove()
    assert not release.root.exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=releases.ROOT, capture_output=True, text=True).stdout
    assert str(release.root) not in listed


def test_without_git_the_previous_release_is_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_git(*args: str) -> str:
        raise OSError("not a git repository")

    monkeypatch.setattr(releases, "_git", no_git)
    release = releases.build_previous(tmp_path / "previous")
    try:
        assert release.how == "copy" and not (release.root / ".git").exists()
        assert not (release.root / ".venv").exists()
        found = load(release.root)
        assert found["upgraded"] == 1 and found["tool"] is True
    finally:
        release.remove()
