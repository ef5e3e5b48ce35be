"""Stored rows of an older event version, for the doors' tests (issue 29:
every door shows payloads lifted to the catalogue's version).

Two kinds of old row: a real one, session/upgraded at version 1 (bare
numbers; the catalogue reads version 2, {number, digest}), and
user/message written at version 1 before a test version 2 whose step from
1 rewrites the text (`user_message_v2`), so a row's text says at a glance
whether the door lifted it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from sessions_app import log
from sessions_app.log import catalogue, upcasters
from sessions_app.models import Event

OLD_TEXT = "  said under version 1  "
LIFTED_TEXT = "said under version 1, read as version 2"
LIFTED_UPGRADE = {"from": {"number": 1, "digest": None}, "to": {"number": 2, "digest": None}, "by": "policy"}


# session/upgraded as the release before version 2 had it.
PREVIOUS_UPGRADED = catalogue.Kind(
    "session/upgraded",
    {
        "type": "object",
        "properties": {"from": {"type": ["integer", "null"]}, "to": {"type": "integer", "minimum": 1}, "by": {}},
        "required": ["from", "to", "by"],
        "additionalProperties": False,
    },
    False,
    "The session moves from agent version `from` to `to` (version 1).",
    lambda d: [("agent_version = %s", [d["to"]])],
)


def _strip(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "text": f"{data['text'].strip()}, read as version 2"}


@contextlib.contextmanager
def previous_release(kind: str, spec: catalogue.Kind) -> Iterator[None]:
    """Appends inside write `kind` as the previous release did (its catalogue entry `spec`)."""
    current = catalogue.CATALOGUE[kind]
    catalogue.CATALOGUE[kind] = spec
    try:
        yield
    finally:
        catalogue.CATALOGUE[kind] = current


def store_old_rows(session_id: uuid.UUID) -> tuple[int, int]:
    """A finished turn whose user/message the previous release wrote (at
    version 1), and a session/upgraded as it stored it: (their seqs)."""
    log.append(session_id, "turn/start", {})
    with previous_release("user/message", replace(catalogue.CATALOGUE["user/message"], version=1)):
        said = log.append(session_id, "user/message", {"text": OLD_TEXT}).seq
    log.append(session_id, "assistant/message", {"content": "answered"})
    log.append(session_id, "turn/end", {"status": "completed"})
    with previous_release("session/upgraded", PREVIOUS_UPGRADED):
        moved = log.append(session_id, "session/upgraded", {"from": 1, "to": 2, "by": "policy"}).seq
    stored = dict(Event.objects.filter(session_id=session_id, seq__in=(said, moved)).values_list("seq", "version"))
    assert stored == {said: 1, moved: 1}
    return said, moved


@pytest.fixture
def user_message_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on this code reads user/message at version 2 (the rows already stored stay at 1)."""
    monkeypatch.setitem(catalogue.CATALOGUE, "user/message", replace(catalogue.CATALOGUE["user/message"], version=2))
    monkeypatch.setitem(upcasters.UPCASTERS, ("user/message", 1), _strip)
