"""Fan-out: committed events reach listeners in seq order, after commit, never nested."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from sessions_app.log import AppendedEvent, append, backends, fanout, locked, on_event, runs
from sessions_app.log.fanout import _Dispatcher

# Listeners run from on_commit callbacks, so these tests need real commits.
pytestmark = pytest.mark.django_db(transaction=True)

Listen = Callable[..., list[AppendedEvent]]


@pytest.fixture
def listen() -> Iterator[Listen]:
    """Register a recording listener for the test only."""
    before = list(fanout._listeners)

    def register(*kinds: str, then: Callable[[AppendedEvent], None] | None = None) -> list[AppendedEvent]:
        seen: list[AppendedEvent] = []

        @on_event(*kinds)
        def record(event: AppendedEvent) -> None:
            seen.append(event)
            if then is not None:
                then(event)

        return seen

    yield register
    fanout._listeners[:] = before


def test_listener_gets_committed_events_in_order(make_session: Any, listen: Listen) -> None:
    s = make_session()
    seen = listen()
    append(s.id, "turn/start", {})
    with locked(s.id) as tx:
        tx.append("user/message", {"text": "a"})
        tx.append("assistant/message", {"content": "b"})
        assert seen[-1].seq == 1  # nothing from this block is delivered before commit
    assert [(e.seq, e.kind) for e in seen] == [(1, "turn/start"), (2, "user/message"), (3, "assistant/message")]
    assert seen[1].data == {"text": "a"}


def test_kind_filter(make_session: Any, listen: Listen) -> None:
    s = make_session()
    titles = listen("session/titled")
    append(s.id, "turn/start", {})
    append(s.id, "session/titled", {"title": "T"})
    assert [(e.seq, e.kind) for e in titles] == [(2, "session/titled")]


def test_nothing_delivered_for_rolled_back_appends(make_session: Any, listen: Listen) -> None:
    s = make_session()
    seen = listen()
    with pytest.raises(RuntimeError), locked(s.id) as tx:
        tx.append("turn/start", {})
        raise RuntimeError
    assert_nothing_pending(s.id)  # the released reservation leaves no entry behind
    with pytest.raises(RuntimeError), transaction.atomic():
        append(s.id, "turn/start", {})
        raise RuntimeError
    assert seen == []
    # ...and the rolled-back seq does not hold back the next one.
    append(s.id, "turn/start", {})
    assert [e.seq for e in seen] == [1]


def test_listener_append_is_delivered_after_its_trigger_never_nested(make_session: Any, listen: Listen) -> None:
    s = make_session()
    order: list[str] = []
    depth = 0
    max_depth = 0

    def react(event: AppendedEvent) -> None:
        nonlocal depth, max_depth
        depth += 1
        max_depth = max(max_depth, depth)
        order.append(f"begin {event.seq} {event.kind}")
        if event.kind == "turn/start":
            # Appends made while handling an event queue behind it.
            append(event.session_id, "step/start", {"step": 1, "model": "demo/offline"})
            append(event.session_id, "step/end", {"step": 1})
        order.append(f"end {event.seq}")
        depth -= 1

    seen = listen(then=react)
    later = listen()  # a second listener must also see the trigger first
    append(s.id, "turn/start", {})
    assert max_depth == 1
    assert order == [
        "begin 1 turn/start",
        "end 1",
        "begin 2 step/start",
        "end 2",
        "begin 3 step/end",
        "end 3",
    ]
    assert [e.seq for e in seen] == [1, 2, 3]
    assert [e.seq for e in later] == [1, 2, 3]


def test_failing_listener_does_not_stop_others(make_session: Any, listen: Listen, caplog: Any) -> None:
    s = make_session()

    def boom(event: AppendedEvent) -> None:
        raise ValueError("listener bug")

    listen(then=boom)
    seen = listen()
    append(s.id, "turn/start", {})
    append(s.id, "turn/end", {"status": "completed"})
    assert [e.seq for e in seen] == [1, 2]
    assert "listener bug" in caplog.text or "failed on" in caplog.text


def assert_nothing_pending(session_id: uuid.UUID) -> None:
    """The process-wide dispatcher keeps no entry for the session: nothing
    waits, and nothing leaks in a long-lived worker."""
    d = fanout.dispatcher
    assert session_id not in d._reserved
    assert session_id not in d._ready
    assert session_id not in d._inflight


@contextmanager
def failing_commit() -> Iterator[None]:
    """Make the next COMMIT on this thread's connection fail (as a dropped
    connection would); Django then rolls the transaction back."""
    conn = connections["default"]

    def fail() -> None:
        raise DatabaseError("simulated commit failure")

    conn.commit = fail  # type: ignore[method-assign]
    try:
        yield
    finally:
        del conn.commit


def other_process_appends(session_id: uuid.UUID, kind: str, data: dict[str, Any]) -> int:
    """What another OS process's append does, as seen from this process: the
    row and seq change, but this process's dispatcher never hears of it."""
    with transaction.atomic():
        (run,) = runs.split(session_id, [runs.prepare(kind, data)], timezone.now(), None, None, False)
        return int(backends.current().append_run(run)[0]["seq"])


def test_failed_commit_in_locked_does_not_stall_later_events(make_session: Any, listen: Listen) -> None:
    """A commit that fails must release the seqs reserved in the block;
    otherwise, once another process takes that seq, every later event of the
    session waits forever in this process's fan-out."""
    s = make_session()
    seen = listen()
    with pytest.raises(DatabaseError), failing_commit(), locked(s.id) as tx:
        tx.append("turn/start", {})
    assert other_process_appends(s.id, "turn/start", {}) == 1  # the rolled-back seq is reused
    ev = append(s.id, "user/message", {"text": "after"})
    assert ev.seq == 2
    assert [e.seq for e in seen] == [2]
    assert_nothing_pending(s.id)


@pytest.mark.embedded
def test_failed_commit_in_append_does_not_stall_later_events(make_session: Any, listen: Listen) -> None:
    # On Postgres append() outside a transaction is one autocommit statement
    # with no client-side COMMIT; the test below covers its failure instead.
    s = make_session()
    seen = listen()
    with pytest.raises(DatabaseError), failing_commit():
        append(s.id, "turn/start", {})
    assert other_process_appends(s.id, "turn/start", {}) == 1
    append(s.id, "user/message", {"text": "after"})
    assert [e.seq for e in seen] == [2]
    assert_nothing_pending(s.id)


def test_failed_append_statement_does_not_stall_later_events(
    make_session: Any, listen: Listen, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_session()
    seen = listen()
    backend = backends.current()
    real_insert = backend.append_run

    def failing_insert(*args: Any) -> list[dict[str, Any]]:
        raise DatabaseError("simulated statement failure")

    monkeypatch.setattr(backend, "append_run", failing_insert)
    with pytest.raises(DatabaseError):
        append(s.id, "turn/start", {})
    monkeypatch.setattr(backend, "append_run", real_insert)
    append(s.id, "turn/start", {})
    assert [e.seq for e in seen] == [1]
    assert_nothing_pending(s.id)


# --- the dispatcher itself: deterministic ordering rules ---------------------


def _ev(sid: uuid.UUID, seq: int) -> AppendedEvent:
    return AppendedEvent(sid, seq, "turn/start", {}, datetime.now(UTC))


@pytest.fixture
def recorded(listen: Listen) -> list[AppendedEvent]:
    return listen()


@pytest.mark.django_db(transaction=False)
def test_dispatcher_holds_a_later_commit_until_the_earlier_reservation_resolves(
    recorded: list[AppendedEvent],
) -> None:
    d = _Dispatcher()
    sid = uuid.uuid4()
    d.reserve(sid, 1)
    d.reserve(sid, 2)
    d.committed(_ev(sid, 2))  # thread B's callback runs first
    assert recorded == []
    d.committed(_ev(sid, 1))
    assert [e.seq for e in recorded] == [1, 2]
    assert not d._ready and not d._reserved  # nothing left behind


@pytest.mark.django_db(transaction=False)
def test_dispatcher_holds_a_session_while_an_autocommit_append_is_in_flight(
    recorded: list[AppendedEvent],
) -> None:
    """Thread A's autocommit statement commits seq 1; before A hands it over,
    thread B (row lock free again) commits seq 2 through locked() and its
    callback runs. Seq 2 must wait for A."""
    d = _Dispatcher()
    sid, other = uuid.uuid4(), uuid.uuid4()
    d.begin(sid)  # A's statement is running
    d.reserve(sid, 2)
    d.committed(_ev(sid, 2))
    d.committed(_ev(other, 1))  # other sessions flow meanwhile
    assert [(e.session_id, e.seq) for e in recorded] == [(other, 1)]
    d.end(sid, _ev(sid, 1))
    assert [(e.session_id, e.seq) for e in recorded] == [(other, 1), (sid, 1), (sid, 2)]
    d.begin(sid)
    d.end(sid, None)  # a failed statement releases the hold
    d.committed(_ev(sid, 3))
    assert recorded[-1].seq == 3
    assert not d._ready and not d._reserved and not d._inflight


@pytest.mark.django_db(transaction=False)
def test_dispatcher_release_unblocks_later_events(recorded: list[AppendedEvent]) -> None:
    d = _Dispatcher()
    sid, other = uuid.uuid4(), uuid.uuid4()
    d.reserve(sid, 5)
    d.reserve(sid, 6)
    d.reserve(other, 1)
    d.committed(_ev(other, 1))  # other sessions are not held back
    d.committed(_ev(sid, 6))
    assert [(e.session_id, e.seq) for e in recorded] == [(other, 1)]
    d.release(sid, [5])  # seq 5 rolled back
    assert [(e.session_id, e.seq) for e in recorded] == [(other, 1), (sid, 6)]


@pytest.mark.postgres
def test_threads_appending_deliver_in_seq_order(make_session: Any, listen: Listen) -> None:
    """Eight threads race on one session; commit callbacks may run in any
    order, but each listener still sees 1..N exactly once, in order."""
    s = make_session()
    seen = listen()
    errors: list[BaseException] = []
    per_thread = 25

    def work(n: int) -> None:
        try:
            for i in range(per_thread):
                if i % 5 == 0:
                    with locked(s.id) as tx:
                        tx.append("input/queued", {"text": f"{n}-{i}a", "wake": False})
                        tx.append("input/queued", {"text": f"{n}-{i}b", "wake": False})
                else:
                    append(s.id, "input/queued", {"text": f"{n}-{i}", "wake": False})
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    total = 8 * (per_thread + per_thread // 5)
    assert [e.seq for e in seen] == list(range(1, total + 1))
    assert_nothing_pending(s.id)
