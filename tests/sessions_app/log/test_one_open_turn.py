"""The log's first invariant, kept by the writer itself: a turn/start is
written only while the session row has no open turn, decided by the
write's own row lock. Every way in (append, append_many, guarded or not,
tx.append under log.locked, fenced or not) meets the same refusal, and the
refused write leaves nothing behind. Runs on both databases."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app import log
from sessions_app.models import Session
from sessions_app.runtime import lease as leases
from tests.helpers import kinds

pytestmark = pytest.mark.django_db

OPEN: list[tuple[str, dict[str, Any]]] = [("turn/start", {}), ("user/message", {"text": "hi"})]


def opened(make_session: Any) -> Session:
    s: Session = make_session()
    log.append_many(s.id, OPEN)
    return s


def test_a_second_turn_start_is_refused_on_every_path_and_writes_nothing(make_session: Any) -> None:
    s = opened(make_session)
    with pytest.raises(log.TurnAlreadyOpen):
        log.append(s.id, "turn/start", {})
    with pytest.raises(log.TurnAlreadyOpen):
        log.append_many(s.id, OPEN)
    with pytest.raises(log.TurnAlreadyOpen), log.locked(s.id) as tx:
        tx.append("turn/start", {"by": "someone"})
    # A turn/start later in a batch refuses the whole batch: nothing before it lands either.
    with pytest.raises(log.TurnAlreadyOpen):
        log.append_many(s.id, [("input/queued", {"text": "x", "wake": True}), *OPEN])
    s.refresh_from_db()
    assert (s.open_turn_seq, s.last_seq, s.turns) == (1, 2, 1)
    assert kinds(s) == ["turn/start", "user/message"]


def test_a_guarded_batch_that_finds_a_turn_open_writes_nothing(make_session: Any) -> None:
    """The refusal rides any guard: empty, like the guard's own failure."""
    s = opened(make_session)
    assert log.append_many(s.id, OPEN, guard="untitled") == []
    assert log.append_many(s.id, OPEN, guard=("policy_at", 0)) == []
    assert log.append_many(s.id, OPEN, guard="idle_empty_inbox") == []
    assert kinds(s) == ["turn/start", "user/message"]


def test_a_turn_opens_again_once_the_open_one_ends(make_session: Any) -> None:
    s = opened(make_session)
    # Closing and opening in one batch: the turn/start's run sees the turn/end before it.
    written = log.append_many(s.id, [("turn/end", {"status": "completed"}), *OPEN])
    assert [e.kind for e in written] == ["turn/end", "turn/start", "user/message"]
    s.refresh_from_db()
    assert s.open_turn_seq == 4 and s.turns == 2


def test_a_fenced_turn_start_is_refused_and_a_stale_fence_is_still_lost(make_session: Any) -> None:
    s = make_session()
    log.append(s.id, "input/queued", {"text": "wake", "wake": True})
    lease = leases.claim(s.id)
    assert lease is not None
    log.append_many(s.id, OPEN)  # admission, which holds no lease, opened a turn since the claim
    with pytest.raises(log.TurnAlreadyOpen), log.locked(s.id, fence=lease.fence) as tx:
        tx.append("turn/start", {})
    with pytest.raises(log.TurnAlreadyOpen):
        log.append(s.id, "turn/start", {}, fence=lease.fence)
    stale = log.Fence(lease.fence.gen - 1, lease.fence.ttl)
    with pytest.raises(log.LeaseLost):
        log.append(s.id, "turn/start", {}, fence=stale)
    assert kinds(s) == ["input/queued", "turn/start", "user/message"]


def test_the_refusal_costs_no_statement_of_its_own(make_session: Any) -> None:
    """The check is in the append's own WHERE: a turn that opens is still
    one UPDATE (on PostgreSQL one statement, the UPDATE-then-INSERT)."""
    s = make_session()
    with CaptureQueriesContext(connection) as queries:
        log.append_many(s.id, OPEN)
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    updates = [sql for sql in statements if "UPDATE sessions_app_session" in sql]
    assert len(updates) == 1 and "open_turn_seq IS NULL" in updates[0]
    if connection.vendor == "postgresql":
        assert len(statements) == 1
