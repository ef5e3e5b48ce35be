"""Guarded appends (append_many(guard=...)): the check and the
write are one statement under the session row lock, and a failed guard
writes nothing. Runs on both databases."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from sessions_app import log
from sessions_app.log import SessionNotFound
from tests.helpers import kinds

pytestmark = pytest.mark.django_db


def append_if(session_id: Any, kind: str, data: dict[str, Any], *, guard: Any) -> Any:
    """One guarded event: the event, or None when the guard failed."""
    written = log.append_many(session_id, [(kind, data)], guard=guard)
    return written[0] if written else None


def test_append_if_writes_while_the_guard_holds_and_then_nothing(make_session: Any) -> None:
    s = make_session()
    first = append_if(s.id, "session/titled", {"title": "First"}, guard="untitled")
    assert first is not None and first.seq == 1
    again = append_if(s.id, "session/titled", {"title": "Second"}, guard="untitled")
    assert again is None
    s.refresh_from_db()
    assert s.title == "First" and s.last_seq == 1
    assert kinds(s) == ["session/titled"]


def test_append_if_refuses_an_unknown_guard_and_a_missing_session(make_session: Any) -> None:
    s = make_session()
    with pytest.raises(ValueError, match="unknown append guard"):
        append_if(s.id, "session/titled", {"title": "x"}, guard="whenever")
    with pytest.raises(SessionNotFound):
        append_if("00000000-0000-0000-0000-000000000000", "session/titled", {"title": "x"}, guard="untitled")
    with pytest.raises(log.InvalidPayload):
        append_if(s.id, "session/titled", {"title": ""}, guard="untitled")
    assert kinds(s) == []


def test_guarded_batch_is_all_or_nothing(make_session: Any) -> None:
    s = make_session()
    items: list[tuple[str, dict[str, Any]]] = [("turn/start", {}), ("user/message", {"text": "hi"})]
    opened = log.append_many(s.id, items, guard="idle_empty_inbox")
    assert [e.seq for e in opened] == [1, 2]
    # A turn is open now: the same guarded batch writes nothing.
    assert log.append_many(s.id, items, guard="idle_empty_inbox") == []
    s.refresh_from_db()
    assert s.open_turn_seq == 1 and s.last_seq == 2
    assert kinds(s) == ["turn/start", "user/message"]


def test_queued_input_fails_the_idle_guard(make_session: Any) -> None:
    s = make_session()
    log.append(s.id, "input/queued", {"text": "earlier", "wake": False})
    assert log.append_many(s.id, [("turn/start", {}), ("user/message", {"text": "x"})], guard="idle_empty_inbox") == []
    assert kinds(s) == ["input/queued"]


def test_guarded_batch_inside_a_transaction(make_session: Any) -> None:
    from django.db import transaction

    s = make_session()
    with transaction.atomic():
        assert (
            len(log.append_many(s.id, [("turn/start", {}), ("user/message", {"text": "a"})], guard="idle_empty_inbox"))
            == 2
        )
        assert (
            log.append_many(s.id, [("turn/start", {}), ("user/message", {"text": "b"})], guard="idle_empty_inbox") == []
        )
    assert kinds(s) == ["turn/start", "user/message"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_guarded_titles_land_once(make_session: Any) -> None:
    s = make_session()
    results: list[Any] = []
    barrier = threading.Barrier(8)

    def title(i: int) -> None:
        barrier.wait()
        try:
            results.append(append_if(s.id, "session/titled", {"title": f"t{i}"}, guard="untitled"))
        finally:
            connection.close()

    threads = [threading.Thread(target=title, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    landed = [r for r in results if r is not None]
    assert len(results) == 8 and len(landed) == 1
    assert kinds(s) == ["session/titled"]
    s.refresh_from_db()
    assert s.title == landed[0].data["title"]


def test_the_policy_head_guard_compares_with_a_value(make_session: Any) -> None:
    """("policy_at", seq): the batch is written only while the session's
    policy head is that policy/updated seq (0: none yet)."""
    s = make_session()
    batch = [("user/message", {"text": "a"}), ("context/injected", {"text": "b"})]
    assert len(log.append_many(s.id, batch, guard=("policy_at", 0))) == 2
    policy = log.append(s.id, "policy/updated", {"patterns": ["clock.*"], "by": "owner"})
    assert log.append_many(s.id, batch, guard=("policy_at", 0)) == []
    assert log.append_many(s.id, batch, guard=("policy_at", policy.seq + 1)) == []
    written = log.append_many(s.id, batch, guard=("policy_at", policy.seq))
    assert [e.seq for e in written] == [policy.seq + 1, policy.seq + 2]
    assert kinds(s) == ["user/message", "context/injected", "policy/updated", "user/message", "context/injected"]
    with pytest.raises(ValueError, match="takes 1 value"):
        log.append_many(s.id, batch, guard="policy_at")
    with pytest.raises(ValueError, match="takes 0 value"):
        log.append_many(s.id, batch, guard=("untitled", 1))
    with pytest.raises(ValueError, match="takes 1 value"):
        log.append_many(s.id, batch, guard=("policy_at",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes 1 value"):
        log.append_many(s.id, batch, guard=("policy_at", 1, 2))  # type: ignore[arg-type]
    assert len(kinds(s)) == 5
