"""Issue 29: the session socket's catch-up frames carry stored rows of an
older event version lifted to the catalogue's version."""

from __future__ import annotations

import pytest

from tests.sessions_app.lifted import LIFTED_TEXT, LIFTED_UPGRADE, store_old_rows, user_message_v2
from tests.sessions_app.sockutil import db, events_of, fresh_channel_layer, open_socket, synced

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer, user_message_v2


async def test_catch_up_frames_are_lifted(world, user_message_v2):
    said, moved = await db(store_old_rows)(world["sid"])
    comm = await open_socket(f"/ws/sessions/{world['sid']}/?token={world['token']}&after=0")
    by_seq = {f["seq"]: f for f in events_of(await synced(comm))}
    assert by_seq[said]["data"] == {"text": LIFTED_TEXT}
    assert by_seq[moved]["data"] == LIFTED_UPGRADE
    await comm.disconnect()
