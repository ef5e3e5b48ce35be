"""Issue 29: the session socket's catch-up and live frames carry stored rows of an
older event version lifted to the catalogue's version."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sessions_app import log
from sessions_app.log import catalogue
from tests.sessions_app.lifted import (
    LIFTED_TEXT,
    LIFTED_UPGRADE,
    OLD_TEXT,
    previous_release,
    store_old_rows,
    user_message_v2,
)
from tests.sessions_app.sockutil import db, events_of, fresh_channel_layer, open_socket, recv_until, synced

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer, user_message_v2


async def test_catch_up_frames_are_lifted(world, user_message_v2):
    said, moved = await db(store_old_rows)(world["sid"])
    comm = await open_socket(f"/ws/sessions/{world['sid']}/?token={world['token']}&after=0")
    by_seq = {f["seq"]: f for f in events_of(await synced(comm))}
    assert by_seq[said]["data"] == {"text": LIFTED_TEXT}
    assert by_seq[moved]["data"] == LIFTED_UPGRADE
    await comm.disconnect()


def _append_old_message(sid) -> int:
    with previous_release("user/message", replace(catalogue.CATALOGUE["user/message"], version=1)):
        return log.append(sid, "user/message", {"text": OLD_TEXT}).seq


async def test_live_frames_are_lifted(world, user_message_v2):
    comm = await open_socket(f"/ws/sessions/{world['sid']}/?token={world['token']}&after=0")
    await synced(comm)
    seq = await db(_append_old_message)(world["sid"])  # a web process of the previous release writes it
    frames = await recv_until(comm, lambda f: f.get("seq") == seq)
    assert events_of(frames)[-1]["data"] == {"text": LIFTED_TEXT}
    await comm.disconnect()
