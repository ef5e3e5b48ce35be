"""Storage tiering (issue 33.5, docs/storage.md): a quiet session's events
move into one compressed, checksummed segment; the event table keeps the
session row and the tombstone; any touch reads them back with the same
seqs. A cold session of 10,000 events replays to a reconnecting socket
(a cursor from before the move), forks exactly as it did hot, and takes a
new turn, on both databases, and under a real worker on PostgreSQL."""

from __future__ import annotations

import json
import zlib
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from sessions_app import actions, log, services
from sessions_app.errors import StorageBusy, StorageCorrupt
from sessions_app.models import ColdSegment, Event, Session
from sessions_app.runtime import storage
from sessions_app.runtime.drive import drive
from tests.fakes.fake_llm import Reply
from tests.helpers import edit_profile, wait_for
from tests.sessions_app.apiutil import bearer, call, token_for
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket, recv_until

pytestmark = [pytest.mark.django_db(transaction=True)]
_ = fresh_channel_layer  # an autouse fixture

USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "cost": 0.00001}


def turn_events(n: int) -> list[tuple[str, dict[str, Any]]]:
    """One closed turn: 10 events (a tool call and a reply)."""
    call_ = {"id": f"call_{n}", "name": "debug.noop", "arguments": "{}"}
    return [
        ("turn/start", {}),
        ("user/message", {"text": f"request {n}: ünïcode and all"}),
        ("step/start", {"step": 1, "model": "test/model"}),
        ("assistant/message", {"content": None, "tool_calls": [call_], "usage": USAGE}),
        ("tool/result", {"call_id": call_["id"], "name": "debug.noop", "content": "ok", "is_error": False}),
        ("step/end", {"step": 1, "usage": USAGE}),
        ("step/start", {"step": 2, "model": "test/model"}),
        ("assistant/message", {"content": f"done {n}", "tool_calls": [], "usage": USAGE}),
        ("step/end", {"step": 2, "usage": USAGE}),
        ("turn/end", {"status": "completed"}),
    ]


def build(session_id: Any, turns: int) -> int:
    for n in range(turns):
        log.append_many(session_id, turn_events(n))
    return int(Session.objects.get(id=session_id).last_seq)


def snapshot(session_id: Any, upto: int) -> list[tuple[int, str, Any, Any, int]]:
    rows = Event.objects.filter(session_id=session_id, seq__lte=upto).order_by("seq")
    return list(rows.values_list("seq", "kind", "data", "created_at", "version"))


def rows(session_id: Any) -> int:
    return Event.objects.filter(session_id=session_id).count()


@pytest.fixture
def staff(make_user: Any) -> Any:
    return make_user("staff", is_staff=True)


def test_move_cold_keeps_a_tombstone_and_reads_back_with_the_same_seqs(
    client: Any, session: Session, staff: Any, owner: Any
) -> None:
    head = build(session.id, 1000)
    assert head == 10_001  # agent/spawned, then 1,000 turns of 10
    before = snapshot(session.id, head)
    nbytes = Session.objects.get(id=session.id).log_bytes
    assert nbytes > 10_000 * 20
    staff_auth, owner_auth = bearer(token_for(staff)), bearer(token_for(owner))
    url = f"/api/sessions/{session.id}/storage"

    denied = call(client, "POST", url, {"tier": "cold"}, **owner_auth)
    assert denied.status_code == 403 and rows(session.id) == head
    moved = call(client, "POST", url, {"tier": "cold"}, **staff_auth)
    assert moved.status_code == 200, moved.data
    assert moved.data["tier"] == "cold" and moved.data["events"] == head + 1
    # The table keeps the session row and the tombstone only.
    assert list(Event.objects.filter(session=session).values_list("seq", "kind")) == [(head + 1, "storage/cold")]
    tomb = Event.objects.get(session=session, kind="storage/cold").data
    assert (tomb["through_seq"], tomb["events"], tomb["by"]) == (head, head, "staff")
    (segment,) = ColdSegment.objects.filter(session=session)
    assert segment.stored_bytes * 5 < segment.raw_bytes  # compressed
    assert moved.data["stored_bytes"] == segment.stored_bytes
    # GET reports the storage and reads nothing back.
    got = call(client, "GET", f"/api/sessions/{session.id}", **owner_auth)
    assert got.data["storage"]["tier"] == "cold" and got.data["storage"]["bytes"] >= nbytes
    assert rows(session.id) == 1
    again = call(client, "POST", url, {"tier": "cold"}, **staff_auth)
    assert again.status_code == 200 and ColdSegment.objects.count() == 1  # already cold: nothing changes
    bad = call(client, "POST", url, {"tier": "lukewarm"}, **staff_auth)
    assert bad.status_code in (400, 422) and rows(session.id) == 1

    # A read through any door reads it back: the same seqs, payloads, times, versions.
    page = call(client, "GET", f"/api/sessions/{session.id}/events?after=4999&limit=3", **owner_auth)
    assert [e["seq"] for e in page.data["events"]] == [5000, 5001, 5002]
    assert snapshot(session.id, head) == before
    hot = Event.objects.get(session=session, kind="storage/hot").data
    assert (hot["through_seq"], hot["events"], hot["by"]) == (head, head, "")
    assert Session.objects.get(id=session.id).storage_tier == "hot"
    assert not ColdSegment.objects.exists()


def test_a_cold_session_forks_as_it_did_hot_and_takes_a_new_turn(
    session: Session, staff: Any, owner: Any, fake_llm: Any, manual_worker: None
) -> None:
    head = build(session.id, 1000)
    at = 5001  # turn 499's turn/end: a fork point
    hot_child = actions.fork(owner, session.id, at, "historical")
    actions.set_storage(staff, session.id, "cold")
    assert rows(session.id) == 1
    cold_child = actions.fork(owner, session.id, at, "historical")  # reads the parent back first
    copied = [list(snapshot(c.id, 10**9)) for c in (hot_child, cold_child)]
    assert [(k, d) for _, k, d, _, _ in copied[0][1:]] == [(k, d) for _, k, d, _, _ in copied[1][1:]]
    assert Session.objects.get(id=session.id).storage_tier == "hot"

    actions.set_storage(staff, session.id, "cold")
    cold_at = Session.objects.get(id=session.id).last_seq
    assert rows(session.id) == 1
    fake_llm.script(Reply(text="still here"))
    receipt = actions.inject(owner, session.id, "and now?", True, None)
    assert receipt.disposition == "started"
    assert drive(session.id) == "ended"
    kinds = list(Event.objects.filter(session=session, seq__gt=cold_at).values_list("seq", "kind"))
    assert kinds[0] == (cold_at + 1, "storage/hot")
    assert (receipt.turn_seq, kinds[1][1]) == (cold_at + 2, "turn/start")
    assert kinds[-1][1] == "turn/end"
    assert rows(session.id) == Session.objects.get(id=session.id).last_seq  # gapless, 1..head
    assert list(Event.objects.filter(session=session).values_list("seq", flat=True)[:3]) == [1, 2, 3]
    (request,) = fake_llm.requests
    said = [m.get("content") for m in request["messages"] if m["role"] == "user"]
    assert said[0] == "request 0: ünïcode and all" and said[-1] == "and now?"  # the whole log, read back
    assert head < cold_at


async def test_a_cold_session_replays_to_a_reconnecting_socket(session: Session, staff: Any, owner: Any) -> None:
    head = await db(build)(session.id, 1000)
    seen = 5000  # a client that saw seqs up to 5000 before the move
    before = await db(snapshot)(session.id, head)
    await db(actions.set_storage)(staff, session.id, "cold")
    assert await db(rows)(session.id) == 1
    token = await db(token_for)(owner)
    comm = await open_socket(f"/ws/sessions/{session.id}/?token={token}&after={seen}")
    frames = await recv_until(comm, lambda f: f.get("type") == "synced", timeout=60)
    events = [f for f in frames if f.get("type") == "event"]
    assert [e["seq"] for e in events] == list(range(seen + 1, head + 3))
    assert [e["kind"] for e in events[-2:]] == ["storage/cold", "storage/hot"]
    assert [(e["seq"], e["kind"], e["data"]) for e in events[:-2]] == [(s, k, d) for s, k, d, _, _ in before[seen:]]
    await comm.disconnect()


def test_only_a_quiet_session_moves_cold(session: Session, staff: Any, manual_worker: None) -> None:
    build(session.id, 3)
    services.run_turn(session.id, "busy")
    with pytest.raises(StorageBusy, match="a turn is open"):
        actions.set_storage(staff, session.id, "cold")
    assert not ColdSegment.objects.exists() and Session.objects.get(id=session.id).storage_tier == "hot"


def test_a_segment_that_fails_its_checksum_restores_nothing(session: Session, staff: Any, owner: Any) -> None:
    build(session.id, 20)
    actions.set_storage(staff, session.id, "cold")
    segment = ColdSegment.objects.get()
    lines = zlib.decompress(bytes(segment.data)).replace(b"done 7", b"done 8")
    ColdSegment.objects.filter(pk=segment.pk).update(data=zlib.compress(lines))
    with pytest.raises(StorageCorrupt):
        actions.events(owner, session.id, 0, 10)
    assert rows(session.id) == 1 and Session.objects.get(id=session.id).storage_tier == "cold"


def test_the_sweep_moves_quiet_sessions_cold_and_deletes_old_archives(
    session: Session, make_user: Any, profile: Any
) -> None:
    other = services.create_session(make_user("other"), profile)
    build(session.id, 5)
    build(other.id, 5)
    long_ago = timezone.now() - timedelta(days=3)
    Session.objects.filter(id=session.id).update(last_event_at=long_ago)
    storage.move_quiet()
    assert Session.objects.get(id=session.id).storage_tier == "hot"  # no policy: kept hot
    edit_profile(profile, cold_after_days=2, delete_cold_after_days=30)
    storage.move_quiet()
    assert Session.objects.get(id=session.id).storage_tier == "cold"
    assert Session.objects.get(id=other.id).storage_tier == "hot"  # not quiet long enough
    assert Event.objects.get(session=session, kind="storage/cold").data["by"] == "policy"
    storage.move_quiet()
    assert ColdSegment.objects.get().deleted_at is None  # not old enough
    ColdSegment.objects.update(created_at=timezone.now() - timedelta(days=31))
    storage.move_quiet()
    segment = ColdSegment.objects.get()
    assert segment.deleted_at is not None and bytes(segment.data) == b""
    assert Session.objects.get(id=session.id).storage_tier == "deleted"
    assert Event.objects.get(session=session, kind="storage/deleted").data["through_seq"] == 51


@pytest.mark.worker
def test_under_a_worker_a_cold_session_takes_its_next_turn(
    start_worker: Any, fake_llm: Any, session: Session, staff: Any, owner: Any
) -> None:
    build(session.id, 200)
    actions.set_storage(staff, session.id, "cold")
    assert rows(session.id) == 1
    fake_llm.script(Reply(text="back"))
    start_worker(name="a")
    actions.inject(owner, session.id, "wake up", True, None)
    wait_for(lambda: Event.objects.filter(session=session, kind="turn/end").count() == 201, what="the new turn")
    assert len(fake_llm.requests) == 1
    said = [m.get("content") for m in fake_llm.requests[0]["messages"] if m["role"] == "user"]
    assert said[0] == "request 0: ünïcode and all" and said[-1] == "wake up"
    # Gapless from 1, read in one query (the after-turn hooks may still be appending: the title).
    seqs = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_bytes_per_session_profile_and_total_on_metrics_and_the_admin(
    client: Any, session: Session, staff: Any, make_user: Any, profile: Any
) -> None:
    from tests.terret_site.test_metrics import scrape, value

    other = services.create_session(make_user("other"), profile)
    build(session.id, 30)
    build(other.id, 10)
    a, b = (Session.objects.get(id=s.id).log_bytes for s in (session, other))
    assert a > 2.5 * b > 0  # 301 events against 100: linear in the events
    for s in (session, other):  # the payloads' UTF-8 bytes, as the append wrote them
        payloads = Event.objects.filter(session=s).values_list("data", flat=True)
        stored = sum(len(json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()) for d in payloads)
        assert Session.objects.get(id=s.id).log_bytes == stored
    client.force_login(staff)
    samples = scrape(client)
    assert value(samples, "terret_log_bytes", profile=profile.name, tier="hot") == a + b
    assert value(samples, "terret_log_events", profile=profile.name, tier="hot") == 301 + 100
    assert value(samples, "terret_log_bytes_largest_session") == a
    actions.set_storage(staff, session.id, "cold")
    samples = scrape(client)
    cold_bytes = Session.objects.get(id=session.id).log_bytes
    assert value(samples, "terret_log_bytes", profile=profile.name, tier="cold") == cold_bytes
    assert value(samples, "terret_cold_stored_bytes", profile=profile.name) == ColdSegment.objects.get().stored_bytes
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    page = client.get("/admin/sessions_app/session/").content.decode()
    assert f'<td class="field-log_size">{cold_bytes:,}</td>' in page  # per session
    total = sum(Session.objects.values_list("log_bytes", flat=True))
    assert total == cold_bytes + b  # the tombstone's bytes count, as every event's
    assert f"{total:,} bytes of log in total" in page  # in total
    profiles = client.get("/admin/sessions_app/agentprofile/").content.decode()
    assert f'<td class="field-log_size">{total:,}</td>' in profiles  # per profile
