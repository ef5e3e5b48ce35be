"""TERRET_TEST_RELEASE=next, the rolling-deploy drill's next release
(tests/chaos/test_rolling_deploy.py): what it changes, and that nothing
changes without it."""

from __future__ import annotations

import pytest

from sessions_app.log import catalogue, upcasters
from sessions_app.runtime import codever
from sessions_app.tools.builtins import BUILTINS


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The catalogue entry, the built-in and the upcasters are put back after the test."""
    monkeypatch.setitem(catalogue.CATALOGUE, "step/start", catalogue.CATALOGUE["step/start"])
    monkeypatch.setitem(BUILTINS, "clock.now", BUILTINS["clock.now"])
    monkeypatch.setattr(upcasters, "UPCASTERS", dict(upcasters.UPCASTERS))
    return monkeypatch


def test_the_next_release_writes_step_start_at_version_2_and_lacks_clock_now(restored: pytest.MonkeyPatch) -> None:
    restored.setenv(codever.TEST_RELEASE_ENV, "next")
    codever.apply_test_release()
    assert catalogue.versions()["step/start"] == 2
    assert "clock.now" not in BUILTINS
    older = {"step": 3, "model": "test/model"}
    assert upcasters.lift("step/start", 1, older) == older  # the old release's rows still read
    assert upcasters.missing_steps() == []
    old_reads = {**catalogue.versions(), "step/start": 1}
    assert catalogue.unreadable({"step/start": 2}, old_reads) == "event:step/start@2"


def test_without_the_setting_nothing_changes(restored: pytest.MonkeyPatch) -> None:
    restored.delenv(codever.TEST_RELEASE_ENV, raising=False)
    codever.apply_test_release()
    assert catalogue.versions()["step/start"] == 1
    assert "clock.now" in BUILTINS
    assert ("step/start", 1) not in upcasters.UPCASTERS
