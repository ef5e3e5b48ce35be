"""The fake provider's command line, started the two ways docs and scripts start it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("how", [["tests/fakes/fake_llm.py"], ["-m", "tests.fakes.fake_llm"]])
def test_the_fake_provider_starts_as_a_file_and_as_a_module(how: list[str]) -> None:
    # Its --help imports everything a real start does (the wire names from sessions_app).
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, *how, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--refusal" in done.stdout
