"""The session socket's lane, withdraw and schedule frames."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from sessions_app import services
from sessions_app.models import Schedule
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket, recv_until, send, synced

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer  # an autouse fixture


def ack_of(frames, frame_id):
    return next(f for f in frames if f.get("id") == frame_id)


async def test_lanes_withdraw_and_schedules_over_the_socket(world):
    await db(services.run_turn)(world["sid"], "busy")
    comm = await open_socket(f"/ws/sessions/{world['sid']}/?token={world['token']}")
    await synced(comm)
    await send(comm, {"type": "inject", "id": "f", "text": "later", "lane": "follow_up"})
    ack = ack_of(await recv_until(comm, lambda f: f.get("id") == "f"), "f")
    assert ack["type"] == "ack" and ack["receipt"]["lane"] == "follow_up"
    await send(comm, {"type": "withdraw", "id": "w", "seq": ack["receipt"]["seq"]})
    withdrawn = ack_of(await recv_until(comm, lambda f: f.get("id") == "w"), "w")
    assert withdrawn["receipt"]["disposition"] == "withdrawn"
    due = (timezone.now() + timedelta(hours=1)).isoformat()
    await send(comm, {"type": "schedule", "id": "s", "schedule": {"text": "wake", "due_at": due}})
    made = ack_of(await recv_until(comm, lambda f: f.get("id") == "s"), "s")
    assert made["type"] == "ack" and made["schedule"]["status"] == "pending"
    await send(comm, {"type": "cancel_schedule", "id": "c", "schedule_id": made["schedule"]["id"]})
    cancelled = ack_of(await recv_until(comm, lambda f: f.get("id") == "c"), "c")
    assert cancelled["schedule"]["status"] == "cancelled"
    for n, when in enumerate(("0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-14:00")):
        await send(comm, {"type": "schedule", "id": f"far{n}", "schedule": {"text": "wake", "due_at": when}})
        far = ack_of(await recv_until(comm, lambda f, n=n: f.get("id") == f"far{n}"), f"far{n}")
        assert (far["type"], far["code"]) == ("error", "time_out_of_range")
    await send(comm, {"type": "inject", "id": "r", "text": "x", "multitask_strategy": "reject"})
    refused = ack_of(await recv_until(comm, lambda f: f.get("id") == "r"), "r")
    assert (refused["type"], refused["code"]) == ("error", "turn_already_running")
    assert await db(lambda: Schedule.objects.get().status)() == "cancelled"
    await comm.disconnect()
