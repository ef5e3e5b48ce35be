"""Event schema versions: each event stores the version of its kind it was
written with, readers lift older payloads through the upcasters, and the
session keeps the newest version per kind above 1 for the claim's check.

The lifting is exercised on a test
version 2 of user/message (the catalogue entry and one step patched in);
the registered steps, when there are any, are checked on the stored
examples in upcaster_examples.json. Both databases."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sessions_app.log import append, catalogue, upcasters
from sessions_app.log.projection import derive_messages
from sessions_app.log.reads import event_at, events_since, turn_events, turn_view
from sessions_app.models import Event, Session

EXAMPLES = json.loads((Path(__file__).parent / "upcaster_examples.json").read_text())


def test_every_version_step_is_registered() -> None:
    assert upcasters.missing_steps() == []


@pytest.mark.parametrize("step", sorted(upcasters.UPCASTERS), ids=lambda s: f"{s[0]}@{s[1]}")
def test_each_upcaster_lifts_its_stored_examples(step: tuple[str, int]) -> None:
    kind, version = step
    examples = EXAMPLES.get(f"{kind}@{version}")
    assert examples, f"no stored examples for the upcaster {kind}@{version}"
    for stored, lifted in examples:
        assert upcasters.UPCASTERS[step](json.loads(json.dumps(stored))) == lifted
        if version + 1 == catalogue.CATALOGUE[kind].version:
            catalogue.validate(kind, lifted)  # the last step gives what the schema accepts today


def test_examples_name_registered_upcasters_only() -> None:
    names = {f"{k}@{v}" for k, v in upcasters.UPCASTERS}
    assert set(EXAMPLES) - {"_comment"} <= names


def _strip(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "text": data["text"].strip()}


@pytest.fixture
def user_message_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    """This code now reads and writes user/message at version 2, whose step from 1 strips the text."""
    monkeypatch.setitem(catalogue.CATALOGUE, "user/message", replace(catalogue.CATALOGUE["user/message"], version=2))
    monkeypatch.setitem(upcasters.UPCASTERS, ("user/message", 1), _strip)


def test_the_step_lifts_the_test_version() -> None:
    assert _strip({"text": "  hi \n", "source_seq": 3}) == {"text": "hi", "source_seq": 3}


@pytest.mark.django_db
def test_version_one_events_store_version_one_and_leave_the_session_unmarked(make_session: Any) -> None:
    s = make_session()
    append(s.id, "user/message", {"text": "hi"})
    append(s.id, "input/queued", {"text": "x", "wake": False})
    assert list(Event.objects.filter(session=s).values_list("version", flat=True)) == [1, 1]
    s.refresh_from_db()
    assert s.event_versions is None


@pytest.mark.django_db
def test_readers_lift_older_payloads_to_the_catalogues_version(make_session: Any, monkeypatch: Any) -> None:
    s = make_session()
    start = append(s.id, "turn/start", {}).seq
    append(s.id, "user/message", {"text": "  old  "})  # written by the previous release, at version 1
    monkeypatch.setitem(catalogue.CATALOGUE, "user/message", replace(catalogue.CATALOGUE["user/message"], version=2))
    monkeypatch.setitem(upcasters.UPCASTERS, ("user/message", 1), _strip)
    new = append(s.id, "user/message", {"text": "new  "}).seq  # version 2 stores as it is

    assert list(Event.objects.filter(session=s, kind="user/message").values_list("version", flat=True)) == [1, 2]
    s.refresh_from_db()
    assert s.event_versions == {"user/message": 2}
    texts = [m["content"] for m in derive_messages(s.id)]
    assert texts == ["old", "new  "]
    assert [e.data["text"] for e in turn_events(s.id, start) if e.kind == "user/message"] == ["old", "new  "]
    assert [d["text"] for _, k, d in turn_view(s.id, 0, start) if k == "user/message"] == ["old", "new  "]
    assert [e.data["text"] for e in events_since(s.id, 0) if e.kind == "user/message"] == ["old", "new  "]
    assert event_at(s.id, new).data == {"text": "new  "}  # type: ignore[union-attr]


@pytest.mark.django_db
def test_the_session_keeps_each_kinds_newest_version(make_session: Any, monkeypatch: Any) -> None:
    s = make_session()
    monkeypatch.setitem(catalogue.CATALOGUE, "user/message", replace(catalogue.CATALOGUE["user/message"], version=3))
    monkeypatch.setitem(catalogue.CATALOGUE, "input/queued", replace(catalogue.CATALOGUE["input/queued"], version=2))
    append(s.id, "user/message", {"text": "a"})
    append(s.id, "input/queued", {"text": "b", "wake": False})
    # A writer of older code (a web process mid-deploy) appends afterwards: the newest stays.
    monkeypatch.setitem(catalogue.CATALOGUE, "user/message", replace(catalogue.CATALOGUE["user/message"], version=2))
    append(s.id, "user/message", {"text": "c"})
    s = Session.objects.get(id=s.id)
    assert s.event_versions == {"user/message": 3, "input/queued": 2}
    assert list(Event.objects.filter(session=s).values_list("version", flat=True)) == [3, 2, 2]


def test_unreadable_names_the_first_version_this_code_does_not_read() -> None:
    reads = {"user/message": 2, "input/queued": 1}
    assert catalogue.unreadable(None, reads) is None
    assert catalogue.unreadable({"user/message": 2}, reads) is None
    assert catalogue.unreadable({"user/message": 3}, reads) == "event:user/message@3"
    assert catalogue.unreadable({"input/queued": 2, "user/message": 1}, reads) == "event:input/queued@2"
    assert catalogue.unreadable({"kind/of_the_future": 2}, reads) == "event:kind/of_the_future@2"


def test_lift_refuses_what_it_cannot_read() -> None:
    with pytest.raises(upcasters.CannotLift, match="newer"):
        upcasters.lift("user/message", 2, {"text": "x"})
    assert upcasters.lift("user/message", 1, {"text": "x"}) == {"text": "x"}


def test_a_missing_step_is_refused(user_message_v2: None, monkeypatch: Any) -> None:
    monkeypatch.delitem(upcasters.UPCASTERS, ("user/message", 1))
    assert upcasters.missing_steps() == ["user/message@1"]
    with pytest.raises(upcasters.CannotLift, match="no upcaster"):
        upcasters.lift("user/message", 1, {"text": "x"})


def _renamed(data: dict[str, Any]) -> dict[str, Any]:
    """A test step from version 1 of tool/attempt: the tool's name as version 2 spells it."""
    return {**data, "name": f"{data['name']}@v2"}


@pytest.mark.django_db
def test_the_effect_ledger_reads_older_attempts_lifted(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger (runtime/effects.py: the operators' list, the audit) reads
    through the upcasters too: an attempt written at version 1 is read as
    the current version says."""
    from sessions_app.runtime import effects

    append(session.id, "turn/start", {})
    append(
        session.id, "assistant/message", {"content": None, "tool_calls": [{"id": "c1", "name": "t", "arguments": "{}"}]}
    )
    attempt = {"call_id": "c1", "name": "t", "attempt": 1, "replay": "never", "idempotency_key": "k1", "fence": 0}
    append(session.id, "tool/attempt", attempt)  # by the previous release, at version 1
    monkeypatch.setitem(catalogue.CATALOGUE, "tool/attempt", replace(catalogue.CATALOGUE["tool/attempt"], version=2))
    monkeypatch.setitem(upcasters.UPCASTERS, ("tool/attempt", 1), _renamed)
    (found,) = effects.effects(session.id)
    assert (found.call_id, found.tool, found.attempt) == ("c1", "t@v2", 1)
    (one,) = effects.call_effects(session.id, "c1")
    assert one.tool == "t@v2"
