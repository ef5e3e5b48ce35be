"""The /lg/ door under load (issue 28: M2, M3, M5).

M2 a revoked token ends a live stream, a join and a wait within 5 s (a real
daphne, httpx clients); M3 history of a 2.4 MB thread answers in under 5 MB,
and paging with before/limit meets every checkpoint exactly once; M5 a join
reads nothing of the thread while nothing is committed, and ends as soon as
the hub pushes the run's end (not at a poll).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.utils import timezone

from sessions_app import log
from sessions_app.lg import mapping, ops, stream
from sessions_app.models import ApiToken, Session
from tests.sessions_app.apiutil import new_session, token_for
from tests.sessions_app.lg.conftest import PROFILE
from tests.sessions_app.liveserver import DaphneProcess

TURNS = 60
TEXT = "x" * 20_000  # 60 turns x (question + answer) x 20 kB = 2.4 MB of messages


def big_thread(owner: Any) -> Session:
    session = new_session(owner)
    for i in range(TURNS):
        log.append_many(
            session.id,
            [
                ("turn/start", {"by": "test"}),
                ("user/message", {"text": f"{i} {TEXT}"}),
                ("assistant/message", {"content": f"{i} {TEXT}"}),
                ("turn/end", {"status": "completed"}),
            ],
        )
    return session


def history(client: Client, token: str, thread: uuid.UUID, **body: Any) -> tuple[list[dict[str, Any]], int]:
    answer = client.post(
        f"/lg/threads/{thread}/history", data=json.dumps(body), content_type="application/json", HTTP_X_API_KEY=token
    )
    assert answer.status_code == 200, answer.content[:300]
    return answer.json(), len(answer.content)


@pytest.mark.django_db
def test_history_of_a_large_thread_is_bounded_and_pages_every_checkpoint_once(
    client: Client, make_user: Any, lg_profile: Any
) -> None:
    """M3: N checkpoints each holding the thread so far were quadratic (the
    SDK's default page of 10 was 24 MB here); now under 5 MB at any limit."""
    owner = make_user("big")
    token = token_for(owner)
    session = big_thread(owner)
    expected = {mapping.checkpoint_id(s[0]) for s in ops.view(session, history=True).snapshots}
    assert len(expected) == TURNS * 3  # each message, each run's end

    page, size = history(client, token, session.id)
    assert size < 5_000_000 and len(page) == ops.HISTORY_LIMIT
    head = page[0]["values"]["messages"]
    assert len(head) == TURNS * 2 and head[-1]["content"] == f"{TURNS - 1} {TEXT}", "the head carries its values whole"
    stubbed = [c for c in page if c["metadata"].get("terret_values") == "stubs"]
    assert stubbed, "the older checkpoints of this page did not fit whole"
    for checkpoint in stubbed:
        ids = [m["id"] for m in checkpoint["values"]["messages"]]
        assert ids == [m["id"] for m in head[: len(ids)]], "stubs keep the ids clients place messages by"

    big, size = history(client, token, session.id, limit=1000)
    assert size < 5_000_000 and 1 < len(big) < len(expected), "the byte budget cuts the page short"

    seen: list[str] = []
    before: Any = None
    while True:
        body: dict[str, Any] = {"limit": 25} if before is None else {"limit": 25, "before": before}
        page, size = history(client, token, session.id, **body)
        assert size < 5_000_000
        if not page:
            break
        seen += [c["checkpoint"]["checkpoint_id"] for c in page]
        before = page[-1]["checkpoint"]
    assert len(seen) == len(set(seen)) and set(seen) == expected, "every checkpoint exactly once"


class Counting:
    """Counts calls of a read, passing them through."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
async def test_a_join_reads_nothing_while_idle_and_ends_when_the_hub_pushes(
    make_user: Any, lg_profile: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M5: the join folded the whole thread every 0.5 s; now one fold when it
    starts, then only events after its cursor, when a hint names them."""
    owner = await sync_to_async(make_user)("joiner")
    session = await sync_to_async(new_session)(owner)
    turn = await sync_to_async(log.append)(session.id, "turn/start", {"by": "test"})
    await sync_to_async(log.append)(session.id, "user/message", {"text": "hello"})
    token = await sync_to_async(ApiToken.objects.create)(user=owner, prefix="trt_join0000", key_hash="x")
    folds, reads = Counting(ops.view), Counting(stream.events_after)
    monkeypatch.setattr(ops, "view", folds)
    monkeypatch.setattr(stream, "events_after", reads)
    run_id = mapping.run_id(session.id, turn.seq)
    plan = stream.Plan(session.id, run_id, turn.seq, (), None, owner, token.pk)

    join = asyncio.create_task(stream.wait_for_end(plan, 60))
    await asyncio.sleep(3.5)  # idle: nothing committed
    assert not join.done()
    assert folds.calls == 1, "the thread is folded once, when the join starts"
    assert reads.calls <= 1, f"{reads.calls} reads while idle"

    await sync_to_async(log.append)(session.id, "assistant/message", {"content": "hi"})
    ended = await sync_to_async(log.append)(session.id, "turn/end", {"status": "completed"})
    at = time.monotonic()
    assert await asyncio.wait_for(join, 10) is True
    assert time.monotonic() - at < 1.5, "pushed by the hub's hint, not found by the poll"
    assert folds.calls == 1 and reads.calls <= 4
    assert ended.seq > turn.seq


async def _stream_until_closed(http: httpx.AsyncClient, url: str, started: asyncio.Event) -> list[str]:
    events: list[str] = []
    async with http.stream("GET", url) as answer:
        assert answer.status_code == 200
        async for line in answer.aiter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
                started.set()
    return events


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
async def test_a_revoked_token_ends_streams_joins_and_waits_within_5_s(lg_user: Any) -> None:
    """M2: a live run's stream, a join on it and a wait on a queued run all end
    within 5 s of the token's revocation (the stream with an `error` event,
    the join and the wait with 401), against a real daphne."""
    token = await sync_to_async(token_for)(lg_user)
    server = await asyncio.to_thread(DaphneProcess().start)  # TERRET_WORKER=manual: the runs never end by themselves
    headers = {"x-api-key": token}
    say = {"assistant_id": PROFILE, "input": {"messages": [{"role": "user", "content": "hello"}]}}
    try:
        async with httpx.AsyncClient(base_url=f"{server.http}/lg", headers=headers, timeout=30) as http:
            thread = (await http.post("/threads", json={"metadata": {"graph_id": PROFILE}})).json()["thread_id"]
            run = (await http.post(f"/threads/{thread}/runs", json=say)).json()
            assert run["status"] in ("pending", "running")
            started = asyncio.Event()
            live = asyncio.create_task(
                _stream_until_closed(http, f"/threads/{thread}/runs/{run['run_id']}/stream", started)
            )
            join = asyncio.create_task(http.get(f"/threads/{thread}/runs/{run['run_id']}/join"))
            wait = asyncio.create_task(
                http.post(f"/threads/{thread}/runs/wait", json={**say, "multitask_strategy": "enqueue"})
            )
            await asyncio.wait_for(started.wait(), 20)
            await asyncio.sleep(2.0)  # the join and the wait are waiting
            assert not (live.done() or join.done() or wait.done())

            await sync_to_async(ApiToken.objects.filter(user=lg_user).update)(revoked_at=timezone.now())
            revoked = time.monotonic()
            closed: dict[str, float] = {}

            async def timed(name: str, task: asyncio.Task[Any]) -> Any:
                result = await task
                closed[name] = time.monotonic() - revoked
                return result

            events, joined, waited = await asyncio.wait_for(
                asyncio.gather(timed("stream", live), timed("join", join), timed("wait", wait)), 20
            )
    finally:
        server.kill()
    assert max(closed.values()) < 5.0, closed
    assert events[0] == "metadata" and events[-1] == "error"
    assert joined.status_code == 401 and waited.status_code == 401
