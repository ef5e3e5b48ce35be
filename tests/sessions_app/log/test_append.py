"""The single append path: seq assignment, projections, fences, atomicity.

These run on both databases (the Postgres pass and the SQLite pass); the few
marked `embedded` assert what is specific to the embedded SQLite setup.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from sessions_app import log
from sessions_app.log import Fence, InvalidPayload, LeaseLost, SessionNotFound, UnknownEventKind, append, locked
from sessions_app.models import Event, Session

pytestmark = pytest.mark.django_db


def seqs(session: Session) -> list[int]:
    return list(Event.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))


def test_seqs_are_gapless_from_one(make_session: Any) -> None:
    s = make_session()
    got = [append(s.id, "input/queued", {"text": f"m{i}", "wake": False}).seq for i in range(5)]
    assert got == [1, 2, 3, 4, 5]
    assert seqs(s) == [1, 2, 3, 4, 5]
    s.refresh_from_db()
    assert s.last_seq == 5
    assert s.last_event_at is not None


def test_sessions_have_independent_seq_counters(make_session: Any) -> None:
    a, b = make_session(), make_session()
    append(a.id, "turn/start", {})
    append(a.id, "turn/end", {"status": "completed"})
    assert append(b.id, "turn/start", {}).seq == 1
    assert seqs(a) == [1, 2] and seqs(b) == [1]


def test_appended_event_matches_stored_row(make_session: Any) -> None:
    s = make_session()
    data = {"content": "hé ✓", "tool_calls": [{"id": "c1", "name": "clock.now", "arguments": "{}"}]}
    ev = append(str(s.id), "assistant/message", data)  # str ids are accepted too
    assert ev.session_id == s.id and isinstance(ev.session_id, uuid.UUID)
    row = Event.objects.get(session=s, seq=ev.seq)
    assert row.kind == "assistant/message"
    assert row.data == data  # non-ASCII survives the JSON round trip
    assert abs(row.created_at - ev.created_at) < timedelta(seconds=1)
    assert ev.as_json() == {"seq": 1, "kind": "assistant/message", "data": data, "at": ev.created_at.isoformat()}


def test_projection_columns_follow_the_log(make_session: Any) -> None:
    s = make_session()
    assert s.status == "idle"
    turn = append(s.id, "turn/start", {"by": "u"})
    s.refresh_from_db()
    assert s.open_turn_seq == turn.seq and s.status == "running"

    append(s.id, "approval/requested", {"call_id": "c1", "name": "shell.run", "args": {}})
    append(s.id, "approval/requested", {"call_id": "c2", "name": "shell.run", "args": {}})
    s.refresh_from_db()
    assert s.pending_approvals == 2 and s.status == "waiting_approval"
    append(s.id, "approval/resolved", {"call_id": "c1", "verdict": "approve"})
    s.refresh_from_db()
    assert s.pending_approvals == 1

    append(s.id, "step/end", {"step": 1, "usage": {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.25}})
    append(s.id, "step/end", {"step": 2, "usage": {"prompt_tokens": 1, "completion_tokens": 2, "cost": None}})
    append(s.id, "step/end", {"step": 3})  # closed by a resume: no usage, unpriced
    append(s.id, "usage/recorded", {"purpose": "title", "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    s.refresh_from_db()
    assert s.steps == 3  # usage/recorded is not a step
    assert (s.prompt_tokens, s.completion_tokens) == (14, 11)
    assert s.cost == Decimal("0.25")
    assert s.unpriced_entries == 3  # cost None, no usage, usage without cost

    titled = append(s.id, "session/titled", {"title": "Weather in Paris"})
    policy = append(s.id, "policy/updated", {"patterns": ["clock.*"]})
    inbox = append(s.id, "input/queued", {"text": "later", "wake": True})
    append(s.id, "context/injected", {"text": "later", "source_seq": inbox.seq})
    compacted = append(s.id, "session/compacted", {"upto_seq": titled.seq, "summary": "..."})
    end = append(s.id, "turn/end", {"status": "completed"})
    s.refresh_from_db()
    assert s.title == "Weather in Paris"
    assert s.policy_seq == policy.seq
    assert s.inbox_seq == inbox.seq
    assert s.compacted_seq == compacted.seq
    assert s.open_turn_seq is None and s.pending_approvals == 0 and s.status == "idle"
    assert s.last_seq == end.seq


def test_inbox_seq_never_moves_backwards(make_session: Any) -> None:
    s = make_session()
    append(s.id, "user/message", {"text": "b", "source_seq": 7})
    append(s.id, "user/message", {"text": "a", "source_seq": 3})
    s.refresh_from_db()
    assert s.inbox_seq == 7


def test_approval_counter_does_not_go_negative(make_session: Any) -> None:
    s = make_session()
    append(s.id, "approval/resolved", {"call_id": "c1", "verdict": "deny"})
    s.refresh_from_db()
    assert s.pending_approvals == 0


@pytest.mark.parametrize(
    ("kind", "data", "error"),
    [
        ("no/such-kind", {}, UnknownEventKind),
        ("user/message", {}, InvalidPayload),
        ("user/message", {"text": "x", "extra": 1}, InvalidPayload),
        ("user/message", ["not", "an", "object"], InvalidPayload),
        ("session/titled", {"title": "x" * 81}, InvalidPayload),
    ],
)
def test_bad_append_raises_and_writes_nothing(make_session: Any, kind: str, data: Any, error: type) -> None:
    s = make_session()
    append(s.id, "turn/start", {})
    with pytest.raises(error):
        append(s.id, kind, data)
    s.refresh_from_db()
    assert s.last_seq == 1 and seqs(s) == [1]
    assert s.title == ""
    # The failed call consumed no seq.
    assert append(s.id, "turn/end", {"status": "failed"}).seq == 2


def test_append_to_missing_session() -> None:
    with pytest.raises(SessionNotFound):
        append(uuid.uuid4(), "turn/start", {})
    with pytest.raises(SessionNotFound), locked(uuid.uuid4()):
        pass
    assert Event.objects.count() == 0


def test_fenced_append_checks_generation_and_extends_lease(make_session: Any) -> None:
    s = make_session(lease_owner="w1", lease_gen=4)
    before = timezone.now()
    ev = append(s.id, "turn/start", {}, fence=Fence(gen=4, ttl=60))
    s.refresh_from_db()
    assert ev.seq == 1
    assert s.lease_expires_at is not None and s.lease_expires_at >= before + timedelta(seconds=59)

    with pytest.raises(LeaseLost, match="superseded by 4"):
        append(s.id, "turn/end", {"status": "completed"}, fence=Fence(gen=3, ttl=60))
    with pytest.raises(LeaseLost), locked(s.id, fence=Fence(gen=5, ttl=60)):
        pass
    s.refresh_from_db()
    assert s.last_seq == 1 and seqs(s) == [1]


def test_locked_appends_are_atomic_and_consecutive(make_session: Any) -> None:
    s = make_session()
    with locked(s.id) as tx:
        assert tx.row["last_seq"] == 0 and tx.row["open_turn_seq"] is None
        a = tx.append("turn/start", {})
        b = tx.append("user/message", {"text": "hi"})
    assert (a.seq, b.seq) == (1, 2)
    assert [e.seq for e in tx.appended] == [1, 2]
    with locked(s.id) as tx:
        # The row snapshot reflects the projection written by earlier appends.
        assert tx.row["last_seq"] == 2 and tx.row["open_turn_seq"] == 1


def test_locked_rolls_back_everything_on_error(make_session: Any) -> None:
    s = make_session()
    append(s.id, "turn/start", {})

    class Boom(Exception):
        pass

    with pytest.raises(Boom), locked(s.id) as tx:
        tx.append("user/message", {"text": "one"})
        tx.append("session/titled", {"title": "never"})
        raise Boom
    s.refresh_from_db()
    assert s.last_seq == 1 and s.title == "" and seqs(s) == [1]
    assert append(s.id, "turn/end", {"status": "failed"}).seq == 2


def test_invalid_payload_inside_locked_rolls_back_the_block(make_session: Any) -> None:
    s = make_session()
    with pytest.raises(InvalidPayload), locked(s.id) as tx:
        tx.append("turn/start", {})
        tx.append("turn/end", {"status": "maybe"})
    s.refresh_from_db()
    assert s.last_seq == 0 and s.open_turn_seq is None and seqs(s) == []


@pytest.mark.django_db(transaction=True)
def test_outer_rollback_takes_the_seq_back(make_session: Any) -> None:
    s = make_session()
    append(s.id, "turn/start", {})
    with pytest.raises(RuntimeError), transaction.atomic():
        append(s.id, "user/message", {"text": "gone"})
        raise RuntimeError
    assert append(s.id, "user/message", {"text": "kept"}).seq == 2
    assert [e.data.get("text") for e in Event.objects.filter(session=s).order_by("seq")] == [None, "kept"]


@pytest.mark.embedded
def test_embedded_database_is_sqlite_in_immediate_mode() -> None:
    # The embedded path's serialization argument rests on these options.
    assert connection.vendor == "sqlite"
    assert settings.DATABASES["default"]["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert settings.REDIS_URL is None
    assert settings.TERRET_WORKER == "inprocess"
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels.layers.InMemoryChannelLayer"


@pytest.mark.embedded
def test_embedded_append_and_locked(make_session: Any) -> None:
    s = make_session()
    with locked(s.id) as tx:
        tx.append("turn/start", {})
        tx.append("user/message", {"text": "hello"})
    ev = append(s.id, "assistant/message", {"content": "hi"})
    assert ev.seq == 3
    # SQLite stores UUIDs as hex; the raw SQL path must agree with the ORM's.
    assert list(Event.objects.filter(session_id=s.id).values_list("seq", "kind")) == [
        (1, "turn/start"),
        (2, "user/message"),
        (3, "assistant/message"),
    ]


def test_appended_event_is_frozen(make_session: Any) -> None:
    s = make_session()
    ev = append(s.id, "turn/start", {})
    with pytest.raises(AttributeError):
        ev.seq = 9  # type: ignore[misc]
    assert isinstance(ev, log.AppendedEvent)
