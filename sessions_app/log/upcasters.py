"""Upcasters: how a reader lifts an event written at an older schema version
of its kind to the version the catalogue reads now.

One pure function per version step, registered as (kind, from_version): it
takes the payload of version `from_version` and returns the payload of
`from_version + 1`, touching nothing else. A kind at version N in the
catalogue has a step for every version from 1 to N - 1 (a test checks), and
each step has a test on stored examples (tests/sessions_app/log/test_upcasters.py).

Readers call lift() on each row they turn into a domain object; it is a
dict lookup and nothing more when the row is at its kind's current version,
which is every row until some kind's version moves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sessions_app.log import catalogue

Json = dict[str, Any]
Upcaster = Callable[[Json], Json]

# (kind, from_version) -> the step to from_version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(kind: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register a step: @upcaster("tool/result", 1) def ...(data) -> data."""

    def register(fn: Upcaster) -> Upcaster:
        if (kind, from_version) in UPCASTERS:
            raise ValueError(f"an upcaster for {kind}@{from_version} is already registered")
        UPCASTERS[(kind, from_version)] = fn
        return fn

    return register


class CannotLift(ValueError):
    """An event's version has no path to the catalogue's (a missing step,
    or an event newer than this code reads)."""


def lift(kind: str, version: int, data: Json) -> Json:
    """`data`, written at `version`, as the catalogue's current version of `kind` reads it."""
    spec = catalogue.CATALOGUE.get(kind)
    current = spec.version if spec is not None else 1
    if version == current:
        return data  # the common case
    if version > current:
        raise CannotLift(f"event:{kind}@{version} is newer than this code reads ({current})")
    for step in range(version, current):
        fn = UPCASTERS.get((kind, step))
        if fn is None:
            raise CannotLift(f"no upcaster for {kind}@{step}")
        data = fn(data)
    return data


def lift_shown(kind: str, version: int, data: Json) -> Json:
    """`lift` for a reader that shows events (the API, the socket, the chat
    page, /lg/): an event newer than this code reads (a web process of the
    previous release mid-deploy) is shown as stored, not refused; only a
    driver must not act on what it cannot read (runtime/codever.py)."""
    try:
        return lift(kind, version, data)
    except CannotLift:
        return data


def shown_raw(kind: str, version: int, raw: str) -> str:
    """A stored payload's JSON text as `lift_shown` reads it: the text itself
    (no parse) when the row is at its kind's current version."""
    spec = catalogue.CATALOGUE.get(kind)
    if version == (spec.version if spec is not None else 1):
        return raw
    return json.dumps(lift_shown(kind, version, json.loads(raw)), separators=(",", ":"))


def missing_steps() -> list[str]:
    """Steps the catalogue's versions need that nobody registered (for a test)."""
    return [
        f"{name}@{step}"
        for name, spec in catalogue.CATALOGUE.items()
        for step in range(1, spec.version)
        if (name, step) not in UPCASTERS
    ]


@upcaster("session/upgraded", 1)
def _upgraded_names_versions(data: Json) -> Json:
    """Version 1 named the versions by number only; 2 names each as
    {number, digest} (turn/start's `version`). Version 1 kept no digest, so
    the lifted one is null: "not recorded", never a guess."""
    before = data.get("from")
    return {
        **data,
        "from": None if before is None else {"number": before, "digest": None},
        "to": {"number": data["to"], "digest": None},
    }
