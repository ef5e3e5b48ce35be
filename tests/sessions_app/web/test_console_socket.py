"""The console's live socket (ws/ops/): for staff, each burst of commits
sends the console's body again as an out-of-band swap (the filter and sort
of its query string applied); anyone else is refused, and a staff member who
loses the role is cut off at the next frame."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from sessions_app import services
from sessions_app.log import hints
from sessions_app.models import AgentProfile
from sessions_app.services import operators
from sessions_app.web.console_socket import ConsoleConsumer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


async def _closed_with(communicator: WebsocketCommunicator) -> int:
    out = await communicator.receive_output(timeout=3)
    while out["type"] != "websocket.close":
        out = await communicator.receive_output(timeout=3)
    return int(out["code"])


async def test_staff_get_the_body_live_with_their_filter(make_user: Any, owner: Any, profile: AgentProfile) -> None:
    opsy = await sync_to_async(make_user)("opsy", is_staff=True)
    session = await sync_to_async(services.create_session)(owner, profile)
    revoked = await sync_to_async(services.create_session)(owner, profile)
    await sync_to_async(operators.revoke)(revoked.id, by="opsy")  # a card with a form (Restore)
    communicator = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/ops/?status=idle&sort=title")
    communicator.scope["user"] = opsy
    communicator.scope["cookies"] = {"csrftoken": "c" * 32}
    assert (await communicator.connect())[0]
    await get_channel_layer().group_send(hints.DASHBOARD_GROUP, {"type": "log.hint", "session": str(session.id)})
    body = (await communicator.receive_from(timeout=5)).strip()
    assert body.startswith('<div id="console-body" hx-swap-oob="true">') and "<html" not in body
    assert f'<tr data-session="{session.id}"' in body and f'<tr data-session="{revoked.id}"' not in body  # idle only
    assert 'aria-current="true" class="current">idle<' in body and 'class="current">title<' in body
    assert f'name="csrfmiddlewaretoken" value="{"c" * 32}"' in body
    opsy.is_staff = False
    await sync_to_async(opsy.save)()
    await get_channel_layer().group_send(hints.DASHBOARD_GROUP, {"type": "log.hint", "session": str(session.id)})
    assert await _closed_with(communicator) == 4403
    await communicator.disconnect()


async def test_others_are_refused(owner: Any) -> None:
    communicator = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/ops/")
    communicator.scope["user"] = owner
    assert (await communicator.connect())[0]
    await get_channel_layer().group_send(hints.DASHBOARD_GROUP, {"type": "log.hint", "session": "x"})
    assert await _closed_with(communicator) == 4403
    await communicator.disconnect()
