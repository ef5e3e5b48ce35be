"""The one validator (sessions_app/validation.py): integer bounds from the
column's type, text PostgreSQL can hold; and every domain error, the log's
refusals included, is a TerretError with its code, so every door maps it."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.errors import InvalidInput, InvalidPayload, SessionNotFound, TerretError, UnknownEventKind, as_error
from sessions_app.models import Event, Schedule, Session
from sessions_app.validation import clean_json, clean_text, column_range, int_in_column, without_surrogates


@pytest.mark.parametrize(
    ("field", "bounds"),
    [
        (Schedule._meta.get_field("every_seconds"), (0, 2**31 - 1)),  # PositiveIntegerField
        (Session._meta.get_field("pending_approvals"), (-(2**31), 2**31 - 1)),  # IntegerField
        (Event._meta.get_field("seq"), (-(2**63), 2**63 - 1)),  # BigIntegerField
    ],
)
def test_the_range_is_the_columns(field: Any, bounds: tuple[int, int]) -> None:
    assert column_range(field) == bounds
    assert int_in_column("n", bounds[1], field) == bounds[1]
    with pytest.raises(InvalidInput, match=f"n must be a whole number from {bounds[0]} to {bounds[1]}"):
        int_in_column("n", bounds[1] + 1, field)


@pytest.mark.parametrize("value", [0, 2**31, True, "5", 5.0, None])
def test_int_in_column_refuses_what_the_column_would_not_take(value: Any) -> None:
    with pytest.raises(InvalidInput, match="max_runs must be a whole number from 1 to 2147483647"):
        int_in_column("max_runs", value, Schedule._meta.get_field("max_runs"), minimum=1)


def test_a_text_column_is_no_integer() -> None:
    with pytest.raises(TypeError):
        column_range(Schedule._meta.get_field("text"))


@pytest.mark.parametrize(
    ("value", "problem"),
    [("a\x00b", "NUL"), ("a\ud800", "lone surrogates"), ("\udfff", "lone surrogates"), (5, "must be a string")],
)
def test_clean_text_refuses_what_no_text_column_holds(value: Any, problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        clean_text("title", value)


def test_clean_text_takes_any_other_text() -> None:
    for text in ("", "plain", "ünïcode 😀", "\\u0000 spelled out"):
        assert clean_text("title", text) == text


def test_clean_json_looks_into_keys_and_nested_values() -> None:
    assert clean_json("args", {"a": [1, {"b": "ok"}], "c": None}) == {"a": [1, {"b": "ok"}], "c": None}
    with pytest.raises(InvalidInput, match="args: strings must not contain NUL"):
        clean_json("args", {"a": [1, {"b\x00": "ok"}]})
    with pytest.raises(InvalidInput, match="lone surrogates"):
        clean_json("args", ["x", ("y", "\ud83d")])


def test_without_surrogates_replaces_only_lone_surrogates() -> None:
    assert without_surrogates("a\ud800b😀") == "a\ufffdb😀"
    assert without_surrogates("ascii") == "ascii"


@pytest.mark.parametrize(
    ("error", "plain", "code", "status"),
    [
        (InvalidPayload, ValueError, "invalid_payload", 400),
        (UnknownEventKind, ValueError, "unknown_event_kind", 400),
        (SessionNotFound, LookupError, "unknown_session", 404),
    ],
)
def test_the_logs_refusals_are_terret_errors_that_every_door_maps(
    error: type[TerretError], plain: type[Exception], code: str, status: int
) -> None:
    raised = error("refused")
    assert isinstance(raised, TerretError) and isinstance(raised, plain)  # code catching ValueError still does
    assert as_error(raised) is raised and (raised.code, raised.status) == (code, status)
