"""Reads bounded in bytes as well as count (issue 28, M4): an events page, a
socket replay and an /lg/ read of a session of large events never carry more
than TERRET_READ_MAX_BYTES of payload (one event alone excepted), and paging
on reads every event exactly once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessions_app import log
from sessions_app.live import hub
from sessions_app.log import reads
from tests.sessions_app.apiutil import bearer, new_session, token_for
from tests.sessions_app.sockutil import events_of, fresh_channel_layer, open_socket, synced

_ = fresh_channel_layer  # an autouse fixture
BOUND = 1024 * 1024
TEXT = "x" * 300_000  # ~300 KB each: three fit a page of 1 MiB, not four
BIG = 20


@pytest.fixture
def big(make_user: Any, settings: Any) -> dict[str, Any]:
    settings.TERRET_READ_MAX_BYTES = BOUND
    owner = make_user("owner")
    session = new_session(owner)
    for i in range(BIG):
        log.append(session.id, "input/queued", {"text": f"{i}:{TEXT}", "wake": False})
    return {"owner": owner, "sid": session.id, "token": token_for(owner), "head": 1 + BIG}


def payload_bytes(events: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(e["data"], separators=(",", ":")).encode()) for e in events)


@pytest.mark.django_db
def test_an_events_page_stops_at_the_byte_bound_and_paging_reads_everything_once(client: Any, big: Any) -> None:
    url = f"/api/sessions/{big['sid']}/events"
    seen: list[int] = []
    after: int | None = 0
    pages = 0
    while after is not None:
        body = client.get(url, {"after": after, "limit": 1000}, **bearer(big["token"])).json()
        assert body["events"], body
        assert payload_bytes(body["events"]) <= BOUND
        seen += [e["seq"] for e in body["events"]]
        after = body["next_after"]
        pages += 1
    assert seen == list(range(1, big["head"] + 1))
    assert pages >= BIG // 3  # paged, not fed everything at once


@pytest.mark.django_db
def test_one_event_over_the_bound_is_still_read_alone(make_user: Any, settings: Any) -> None:
    settings.TERRET_READ_MAX_BYTES = 100_000
    session = new_session(make_user("owner"))
    log.append(session.id, "input/queued", {"text": "y" * 200_000, "wake": False})
    log.append(session.id, "input/queued", {"text": "small", "wake": False})
    first = reads.events_page(session.id, 1, 100)
    assert [e["seq"] for e in first] == [2]
    assert [e["seq"] for e in reads.events_page(session.id, 2, 100)] == [3]


@pytest.mark.django_db
def test_lg_reads_are_bounded_too(big: Any) -> None:
    seen: list[int] = []
    after = 0
    while True:
        page = reads.events_after(big["sid"], after, 1000)
        assert sum(len(json.dumps(e.data).encode()) for e in page) <= BOUND or len(page) == 1
        if not page:
            break
        seen += [e.seq for e in page]
        after = page[-1].seq
        if not reads.more_follow(page, 1000):
            break
    assert seen == list(range(1, big["head"] + 1))
    window = reads.newest_window(big["sid"], ["input/queued"], None, 5000)
    assert window and window[-1][0] == big["head"]  # the newest kept
    assert sum(len(json.dumps(r[2]).encode()) for r in window) <= BOUND


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
async def test_a_socket_replay_reads_in_bounded_batches_and_sends_each_event_once(big: Any, monkeypatch: Any) -> None:
    batches: list[int] = []
    real = reads.event_frames

    def spy(*args: Any, **kwargs: Any) -> Any:
        page = real(*args, **kwargs)
        batches.append(sum(len(text) for _, text in page))
        return page

    monkeypatch.setattr(
        hub, "aread_frames", hub.database_sync_to_async(spy, thread_sensitive=False, executor=hub.READ_POOL)
    )
    comm = await open_socket(f"/ws/sessions/{big['sid']}/?token={big['token']}")
    frames = await synced(comm)
    await comm.disconnect()
    assert [f["seq"] for f in events_of(frames)] == list(range(1, big["head"] + 1))
    assert len(batches) >= BIG // 3
    assert all(b <= BOUND + 200 * 3 for b in batches)  # the payload within the bound, plus each frame's envelope
