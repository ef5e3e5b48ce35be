"""Events larger than a socket frame, through a real daphne process: the
session socket sends an explicit stand-in (seq, kind, "oversize": true, its
size, no data) and goes on with the events after it, in replay and live; the
chat page's socket shows the row in part and splits a long replay over
several frames, none over TERRET_SOCKET_MAX_FRAME_BYTES. The client is the
`websockets` library with its default 1 MiB limit, so a frame over it would
end the connection instead."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from websockets.asyncio.client import connect

from sessions_app import log
from tests.sessions_app.apiutil import new_session, token_for
from tests.sessions_app.sockutil import db, frames_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]

ROW = re.compile(r'<li id="ev-(\d+)"')
# 800,000 characters, 1.6 MB in UTF-8: over the limit in bytes, not in characters.
HUGE = "ü" * 800_000


@pytest.fixture
def world(make_user, settings):
    # The log refuses events over TERRET_MAX_EVENT_BYTES (the runtime cuts what it stores
    # to fit); this test writes bigger ones on purpose, as an older log may hold.
    settings.TERRET_MAX_EVENT_BYTES = 8 * 1024 * 1024
    owner = make_user("owner")
    session = new_session(owner)
    return {"sid": session.id, "token": token_for(owner)}


def small(sid, text):
    return log.append(sid, "input/queued", {"text": text, "wake": False}).seq


def huge_result(sid, content=HUGE):
    return log.append(sid, "tool/result", {"call_id": "c1", "name": "workspace.read", "content": content}).seq


def events(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "event"]


async def test_an_oversize_event_goes_out_as_its_stand_in_and_the_stream_goes_on(daphne, world):
    sid, token = world["sid"], world["token"]
    await db(small)(sid, "before")
    big = await db(huge_result)(sid)
    after = await db(small)(sid, "after")

    async with connect(f"{daphne.ws}/ws/sessions/{sid}/?token={token}") as ws:  # max_size: 1 MiB
        replay = events(await frames_until(ws, lambda f: f["type"] == "synced"))
        assert [e["seq"] for e in replay] == list(range(1, after + 1))
        stand_in = next(e for e in replay if e["seq"] == big)
        assert stand_in["kind"] == "tool/result" and stand_in["oversize"] is True
        assert "data" not in stand_in and stand_in["at"]
        assert stand_in["bytes"] > 1_600_000
        assert replay[-1]["data"]["text"] == "after"

        # Live, too: the stand-in, then the next event.
        live_big = await db(huge_result)(sid, "y" * 1_200_000)
        live_after = await db(small)(sid, "live after")
        live = events(await frames_until(ws, lambda f: f.get("seq") == live_after))
        assert [e["seq"] for e in live] == [live_big, live_after]
        assert live[0]["oversize"] is True and "data" not in live[0]
        assert live[1]["data"]["text"] == "live after"

    # The event itself is read over HTTP, as the stand-in tells the client to.
    async with httpx.AsyncClient(base_url=daphne.http, headers={"Authorization": f"Bearer {token}"}) as http:
        page = (await http.get(f"/api/sessions/{sid}/events", params={"after": big - 1, "limit": 1})).json()
        [event] = page["events"]
        assert event["seq"] == big and event["data"]["content"] == HUGE


async def test_the_chat_page_socket_shows_an_oversize_row_in_part_and_splits_a_long_replay(daphne, world):
    sid, token = world["sid"], world["token"]
    limit = django_settings.TERRET_SOCKET_MAX_FRAME_BYTES
    medium = [await db(small)(sid, f"{n}:" + "m" * 200_000) for n in range(8)]  # 1.6 MB in all
    big = await db(huge_result)(sid)
    last = await db(small)(sid, "the end")

    async with connect(f"{daphne.ws}/ws/sessions/{sid}/page/?token={token}&after=0") as ws:
        frames: list[str] = []
        async with asyncio.timeout(30):
            while f'id="ev-{last}"' not in (frames[-1] if frames else ""):
                frames.append(await ws.recv())
        assert len(frames) >= 2  # 1.6 MB of rows: the replay did not fit one frame
        assert all(len(f.encode()) <= limit for f in frames)
        html = "".join(frames)
        assert [int(s) for s in ROW.findall(html)] == list(range(1, last + 1))
        assert all(f'id="ev-{seq}"' in html for seq in medium)
        row = html[html.index(f'<li id="ev-{big}"') :]
        row = row[: row.index("</li>")]
        assert "shown in part" in row and f"/api/sessions/{sid}/events?after={big - 1}&amp;limit=1" in row
        assert "cut" in re.search(r'class="([^"]*)"', row).group(1).split()

        # Live: the oversize row in part, then the next event's row.
        live_big = await db(huge_result)(sid, "z" * 1_300_000)
        live_after = await db(small)(sid, "live after")
        live: list[str] = []
        async with asyncio.timeout(30):
            while f'id="ev-{live_after}"' not in "".join(live):
                live.append(await ws.recv())
        assert all(len(f.encode()) <= limit for f in live)
        text = "".join(live)
        assert f'id="ev-{live_big}"' in text and "shown in part" in text
