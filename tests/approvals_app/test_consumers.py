"""The live queue socket: the queue rendered again after commit, coalesced, permission re-checked."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group

from approvals_app import services as approvals
from sessions_app import services
from sessions_app.services.tokens import issue_token
from tests.approvals_app.conftest import park

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def setup(make_user: Any, make_reviewer: Any, profile: Any, settings: Any) -> dict[str, Any]:
    settings.TERRET_WORKER = "manual"
    reviewer = make_reviewer("rev")
    session = services.create_session(make_user("owner"), profile)
    return {"reviewer": reviewer, "session": session, "token": issue_token(reviewer)[1]}


async def connect(token: str) -> WebsocketCommunicator:
    from terret_site.asgi import application

    comm = WebsocketCommunicator(application, f"/ws/approvals/?token={token}")
    connected, _ = await comm.connect()
    assert connected
    return comm


def is_queue_fragment(html: str) -> bool:
    """The queue partial as an out-of-band swap of #approval-queue."""
    return html.startswith('<div id="approval-queue" hx-swap-oob="true">')


def test_the_fragment_is_the_reviewers_queue_as_an_out_of_band_swap(setup: dict[str, Any]) -> None:
    from approvals_app.consumers import queue_fragment

    park(setup["session"].id, "c1")
    html = queue_fragment(setup["reviewer"]).strip()
    assert is_queue_fragment(html)
    assert 'data-call-id="c1"' in html and "Approve" in html
    assert "<html" not in html  # the partial alone, not the page


async def test_request_and_verdict_each_send_one_fragment(setup: dict[str, Any]) -> None:
    comm = await connect(setup["token"])
    sid = setup["session"].id
    await asyncio.sleep(0.2)  # joined the group
    await sync_to_async(park)(sid, "c1")
    asked = (await comm.receive_from(10)).strip()
    assert is_queue_fragment(asked) and 'data-call-id="c1"' in asked
    await sync_to_async(approvals.decide)(sid, "c1", "approve", user=setup["reviewer"])
    decided = (await comm.receive_from(10)).strip()
    assert is_queue_fragment(decided) and 'data-call-id="c1"' not in decided
    assert "Nothing is waiting for approval." in decided
    assert await comm.receive_nothing(0.5)
    await comm.disconnect()


async def test_a_burst_of_changes_is_one_fragment(setup: dict[str, Any]) -> None:
    comm = await connect(setup["token"])
    sid = setup["session"].id
    await asyncio.sleep(0.2)

    def burst() -> None:
        park(sid, "c1")
        park(sid, "c2", new_turn=False)
        services.cancel(sid)  # denies both

    await sync_to_async(burst)()
    assert is_queue_fragment((await comm.receive_from(10)).strip())
    assert await comm.receive_nothing(0.6)
    await comm.disconnect()


async def test_losing_the_permission_closes_the_socket(setup: dict[str, Any]) -> None:
    comm = await connect(setup["token"])
    await asyncio.sleep(0.2)
    await sync_to_async(lambda: setup["reviewer"].groups.remove(Group.objects.get(name="reviewers")))()
    await sync_to_async(park)(setup["session"].id, "c1")
    frame = json.loads(await comm.receive_from(10))
    assert frame["type"] == "error" and frame["code"] == "not_allowed"
    assert await comm.receive_output(10) == {"type": "websocket.close", "code": 4403}
