"""sockets/frames.py: what fits in a frame, the stand-ins, packing; and the
dashboard's and the chat page's sockets never sending a frame over the
limit (in-process, with the limit lowered)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from sessions_app import log, services
from sessions_app.live import frames
from sessions_app.log import hints
from sessions_app.models import AgentProfile
from sessions_app.web.dashboard_socket import DashboardConsumer
from sessions_app.web.present import TOO_LARGE_NOTICE, EventRow, row_fragment
from tests.sessions_app.apiutil import new_session, token_for
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket

_ = fresh_channel_layer  # an autouse fixture


def event_frame(seq: int, kind: str, data: dict[str, Any]) -> str:
    return json.dumps({"type": "event", "seq": seq, "kind": kind, "data": data, "at": "2026-01-01T00:00:00+00:00"})


def test_size_counts_utf8_bytes_not_characters() -> None:
    assert frames.size("ü" * 10) == 20
    assert frames.fits("ü" * 600, 1200) and not frames.fits("ü" * 601, 1200)
    assert frames.fits("x" * 1200, 1200) and not frames.fits("x" * 1201, 1200)


def test_a_frame_that_fits_goes_out_unchanged() -> None:
    text = event_frame(3, "user/message", {"text": "hi"})
    assert frames.fit(text, frames.event_stand_in, 10_000) == text


def test_an_oversize_event_becomes_its_stand_in_without_data() -> None:
    text = event_frame(42, "tool/result", {"call_id": "c", "name": "n", "content": "ü" * 5000})
    out = json.loads(frames.fit(text, frames.event_stand_in, 4096))
    assert out == {
        "type": "event",
        "seq": 42,
        "kind": "tool/result",
        "at": "2026-01-01T00:00:00+00:00",
        "oversize": True,
        "bytes": frames.size(text),
    }


def test_any_other_oversize_frame_says_so_with_its_type_and_id() -> None:
    text = json.dumps({"type": "ack", "id": "7", "op": "compact", "blob": "x" * 5000})
    assert json.loads(frames.fit(text, frames.event_stand_in, 4096)) == {
        "type": "ack",
        "id": "7",
        "op": "compact",
        "oversize": True,
        "bytes": frames.size(text),
    }
    assert json.loads(frames.fit("x" * 5000, frames.event_stand_in, 4096))["code"] == "frame_too_large"


def test_a_stand_in_that_does_not_fit_either_falls_back_to_the_last_resort() -> None:
    assert json.loads(frames.fit("x" * 5000, lambda t, n: t, 4096))["code"] == "frame_too_large"
    assert frames.fit("x" * 5000, lambda t, n: t, 4096, last_resort="<p>reload</p>") == "<p>reload</p>"


def test_pack_joins_pieces_in_order_within_the_limit() -> None:
    pieces = ["a" * 40, "b" * 40, "c" * 40, "", "d" * 10]
    assert frames.pack(pieces, 100) == ["a" * 40 + "b" * 40, "c" * 40 + "d" * 10]
    assert frames.pack([], 100) == []


def test_an_oversize_row_is_rendered_with_its_text_cut_and_shown_in_part() -> None:
    sid = uuid.uuid4()
    row = EventRow(
        9, "tool/result", {"call_id": "c", "name": "workspace.read", "content": "<b>" * 50_000}, datetime.now(UTC)
    )
    fragment = row_fragment(sid, row)
    assert frames.size(fragment.html) > 64 * 1024
    out = frames.fit(fragment.html, lambda t, n: fragment.stand_in(t, n, max_bytes=64 * 1024), 64 * 1024)
    assert frames.size(out) <= 64 * 1024
    assert out.startswith('<ol hx-swap-oob="beforeend:#log">') and 'id="ev-9"' in out
    assert "shown in part" in out and f"/api/sessions/{sid}/events?after=8&amp;limit=1" in out
    assert "&lt;b&gt;" in out  # still escaped
    # A fragment that is not a row gets the notice.
    assert frames.fit("x" * 5000, lambda t, n: TOO_LARGE_NOTICE, 4096) == TOO_LARGE_NOTICE


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
async def test_the_page_socket_keeps_every_frame_under_the_limit(make_user, settings):
    settings.TERRET_SOCKET_MAX_FRAME_BYTES = 64 * 1024
    owner = await db(make_user)("owner")
    session = await db(new_session)(owner)
    token = await db(token_for)(owner)
    seqs = [
        await db(log.append)(session.id, "input/queued", {"text": f"{n} " + "ü" * 20_000, "wake": False})
        for n in range(6)
    ]
    comm = await open_socket(f"/ws/sessions/{session.id}/page/?token={token}&after=0")
    got: list[str] = []
    while f'id="ev-{seqs[-1].seq}"' not in "".join(got):
        got.append(await comm.receive_from(timeout=10))
    assert len(got) >= 3 and all(frames.size(f) <= 64 * 1024 for f in got)
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
async def test_the_dashboard_socket_sends_a_notice_instead_of_a_body_too_large(make_user, settings):
    settings.TERRET_SOCKET_MAX_FRAME_BYTES = 2000  # the body of one session is larger
    owner = await db(make_user)("alice")
    profile = await db(AgentProfile.objects.create)(name="dash")
    session = await db(services.create_session)(owner, profile)
    communicator = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
    communicator.scope["user"] = owner
    assert (await communicator.connect())[0]
    await get_channel_layer().group_send(hints.DASHBOARD_GROUP, {"type": "log.hint", "sessions": [str(session.id)]})
    message = await communicator.receive_from(timeout=5)
    assert message.startswith('<p id="dashboard-status"') and "too large to update live" in message
    await communicator.disconnect()
