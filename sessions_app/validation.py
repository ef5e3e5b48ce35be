"""Values checked before they reach a column, a query or the log.

Every door (the JSON API, the session socket, the web forms, the LangGraph
door, the agent's tools) calls the same service, and the service checks its
values here, so a bad value is an `InvalidInput` (400, `invalid_input`)
before anything is read or written, the same on both backends:

- an integer past its column's range (`int_in_column`): the bounds come from
  the Django field's type, as the portable ranges every backend shares
  (PostgreSQL's integer is 32 bits; SQLite would take more, and PostgreSQL
  then refuse what SQLite took);
- text PostgreSQL cannot hold or UTF-8 cannot encode (`clean_text`): NUL, and
  lone surrogates (U+D800 to U+DFFF, which JSON's `\\ud800` escapes can
  carry into a Python string).

The log refuses the same text in any payload (log/runs.py: `InvalidPayload`),
so nothing can be appended that a door let through.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import ForeignObjectRel

from sessions_app.errors import InvalidInput

# The ranges of Django's integer fields as PostgreSQL (and the base backend)
# has them; SQLite's own table is wider (64 bits for every type), so this one
# table keeps both backends refusing the same values.
_RANGES: dict[str, tuple[int, int]] = BaseDatabaseOperations.integer_field_ranges
_SURROGATE = re.compile("[\ud800-\udfff]")


# What Model._meta.get_field answers.
type Column = models.Field[Any, Any] | ForeignObjectRel  # lazy: Field is subscriptable for mypy only


def column_range(field: Column) -> tuple[int, int]:
    """The smallest and largest value the integer column of `field` holds."""
    bounds = _RANGES.get(field.get_internal_type())
    if bounds is None:
        raise TypeError(f"{field!r} is not an integer column")
    return bounds


def int_in_column(name: str, value: Any, field: Column, *, minimum: int | None = None) -> int:
    """`value` if it is a whole number that `field`'s column holds (and at
    least `minimum`); InvalidInput naming `name` and the range otherwise."""
    low, high = column_range(field)
    low = low if minimum is None else max(low, minimum)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{name} must be a whole number from {low} to {high}")
    return value


def has_lone_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as text (NUL, a lone surrogate), or None."""
    if "\x00" in value:
        return "must not contain NUL (\\u0000) characters"
    if has_lone_surrogate(value):
        return "must not contain lone surrogates (\\ud800 to \\udfff)"
    return None


def clean_text(name: str, value: Any) -> str:
    """`value` if it is a string that can be stored as text; InvalidInput otherwise."""
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidInput(f"{name} {problem}")
    return value


def json_problem(value: Any) -> str | None:
    """`text_problem` for the first string (key or value) of a JSON-like value that has one."""
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, dict):
        items: Any = (p for k, v in value.items() for p in (k, v))
    elif isinstance(value, list | tuple):
        items = value
    else:
        return None
    for item in items:
        problem = json_problem(item)
        if problem is not None:
            return problem
    return None


def clean_json(name: str, value: Any) -> Any:
    """`value` if every string in it can be stored as text; InvalidInput otherwise."""
    problem = json_problem(value)
    if problem is not None:
        raise InvalidInput(f"{name}: strings {problem}")
    return value


def without_surrogates(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (for text Terret
    did not choose, such as a model's reply, which is stored rather than refused)."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)
