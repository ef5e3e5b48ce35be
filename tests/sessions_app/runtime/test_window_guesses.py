"""What a refusal teaches of a model's window (windows.after_refusal): the
limit a provider states, or, when it states none, the refused request
halved, and halved again, down to the floor; below it, nothing."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.runtime import windows


@pytest.fixture(autouse=True)
def floor(settings: Any) -> None:
    settings.TERRET_CONTEXT_FLOOR_TOKENS = 4_096
    settings.TERRET_CONTEXT_RESERVE_TOKENS = 4_096


def test_a_stated_limit_below_what_was_believed_is_taken() -> None:
    assert windows.after_refusal(None, 20_000, 15_000) == 15_000
    assert windows.after_refusal(128_000, 20_000, 15_000) == 15_000


def test_no_figures_halve_the_refused_request_then_halve_again_down_to_the_floor() -> None:
    first = windows.after_refusal(None, 40_000, None)
    assert first == 20_000
    # Compacted to fit 20,000 and refused again: our estimate was wrong by more than half.
    second = windows.after_refusal(first, 15_000, None)
    assert second == 7_500
    third = windows.after_refusal(second, 6_000, None)
    assert third == 4_096  # half would be under the floor: the floor
    assert windows.after_refusal(third, 3_500, None) is None  # refused at the floor: nothing smaller is believed


def test_a_request_over_the_believed_window_leaves_it_standing() -> None:
    # Sent anyway after a compaction the estimate still put over the window: the window explains the refusal.
    assert windows.after_refusal(15_000, 16_000, None) == 15_000
    assert windows.after_refusal(15_000, 16_000, 15_000) == 15_000


def test_a_stated_limit_the_request_fitted_is_halved_too() -> None:
    # The provider counts more tokens than we estimate: its own figure does not help.
    assert windows.after_refusal(15_000, 10_000, 15_000) == 5_000


def test_halved_never_goes_under_the_floor(settings: Any) -> None:
    assert windows.halved(10_000) == 5_000
    assert windows.halved(5_000) == 4_096
    assert windows.halved(4_096) is None
    settings.TERRET_CONTEXT_FLOOR_TOKENS = 1_000
    assert windows.halved(1_500) == 1_000
