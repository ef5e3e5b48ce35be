"""append_many: the turn loop's batched appends.

transactional_db, so on Postgres these exercise the single autocommit
statement (inside a test transaction every append takes the atomic path)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from sessions_app import log
from sessions_app.log import Fence, InvalidPayload, LeaseLost, append_many, fanout
from sessions_app.models import AgentProfile, Event, Session, UsageDay
from sessions_app.services.usage import log_sum

pytestmark = pytest.mark.django_db(transaction=True)

STEP_TAIL = [
    ("tool/result", {"call_id": "c1", "name": "debug.noop", "content": "ok", "is_error": False}),
    ("step/end", {"step": 1, "usage": {"prompt_tokens": 7, "completion_tokens": 3, "cost": 0.25}}),
    ("step/start", {"step": 2, "model": "m"}),
]


def stored(session: Session) -> list[tuple[int, str]]:
    return list(Event.objects.filter(session=session).order_by("seq").values_list("seq", "kind"))


@pytest.fixture
def session(make_user: Any) -> Session:
    profile = AgentProfile.objects.create(name="batch")
    return Session.objects.create(owner=make_user(), profile=profile)


def test_batch_lands_on_consecutive_seqs_with_projections(session: Session) -> None:
    log.append(session.id, "turn/start", {})
    events = append_many(session.id, STEP_TAIL)
    assert [(e.seq, e.kind) for e in events] == [(2, "tool/result"), (3, "step/end"), (4, "step/start")]
    assert stored(session) == [(1, "turn/start"), (2, "tool/result"), (3, "step/end"), (4, "step/start")]
    session.refresh_from_db()
    assert (session.last_seq, session.steps, session.prompt_tokens, session.completion_tokens) == (4, 1, 7, 3)
    assert session.cost == Decimal("0.25") and session.open_turn_seq == 1
    day = UsageDay.objects.get(profile=session.profile)
    assert (day.steps, day.prompt_tokens, day.cost) == (1, 7, Decimal("0.25"))
    assert log_sum(session.id).prompt_tokens == 7


def test_batch_with_colliding_projections_still_applies_each(session: Session) -> None:
    # two step/ends update the same columns: not one statement, one transaction
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "cost": None}
    events = append_many(session.id, [("step/end", {"step": 1, "usage": usage}), ("step/end", {"step": 2})])
    assert [e.seq for e in events] == [1, 2]
    session.refresh_from_db()
    assert session.steps == 2 and session.unpriced_entries == 2
    assert UsageDay.objects.get(profile=session.profile).steps == 2


def test_bad_payload_in_a_batch_appends_nothing(session: Session) -> None:
    with pytest.raises(InvalidPayload):
        append_many(session.id, [STEP_TAIL[0], ("step/end", {"step": "one"})])
    assert stored(session) == []


def test_stale_fence_appends_nothing(session: Session) -> None:
    Session.objects.filter(id=session.id).update(lease_gen=5)
    with pytest.raises(LeaseLost):
        append_many(session.id, STEP_TAIL, fence=Fence(gen=4, ttl=30))
    assert stored(session) == []
    append_many(session.id, STEP_TAIL, fence=Fence(gen=5, ttl=30))
    assert len(stored(session)) == 3


def test_listeners_see_a_batch_in_order_after_commit(session: Session) -> None:
    seen: list[tuple[int, str]] = []

    @log.on_event()
    def listener(event: log.AppendedEvent) -> None:
        if event.session_id == session.id:
            seen.append((event.seq, event.kind))

    try:
        append_many(session.id, STEP_TAIL)
    finally:
        fanout._listeners[:] = [(k, fn) for k, fn in fanout._listeners if fn is not listener]
    assert seen == [(1, "tool/result"), (2, "step/end"), (3, "step/start")]


@pytest.mark.embedded
def test_batch_on_sqlite(session: Session) -> None:
    events = append_many(session.id, STEP_TAIL)
    assert [e.seq for e in events] == [1, 2, 3]
    session.refresh_from_db()
    assert session.steps == 1 and session.last_seq == 3
