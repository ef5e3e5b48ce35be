"""Issue 27, point 6, at the session socket: a frame with an integer past its
column's range, or text no column can hold, gets an error frame with a code
(never internal_error), and nothing is appended or made."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import Event, Schedule
from tests.sessions_app.apiutil import make_reviewer, park_calls
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket, recv_until, send, synced

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer  # an autouse fixture

HOURLY = {"text": "check the feed", "every_seconds": 3600}

BAD = [
    pytest.param(
        {"type": "schedule", "schedule": {"text": "t", "every_seconds": 2**31}},
        "every_seconds must be a whole number",
        id="every",
    ),
    pytest.param(
        {"type": "schedule", "schedule": {**HOURLY, "max_runs": 2**31}},
        "max_runs must be a whole number",
        id="max_runs",
    ),
    pytest.param(
        {"type": "schedule", "schedule": {**HOURLY, "budget_tokens": 2**63}},
        "budget_tokens must be a whole number",
        id="budget",
    ),
    pytest.param(
        {"type": "approve", "call_id": "c1", "request_seq": 2**63},
        "request seq must be a whole number",
        id="request_seq",
    ),
    pytest.param({"type": "approve", "call_id": "c\x00"}, "NUL", id="call-id-nul"),
    pytest.param(
        {"type": "approve", "call_id": "c1", "edited_args": {"p": "\ud800"}},
        "must not contain lone surrogates",
        id="lone",
    ),
]


def _setup(world: dict[str, Any]) -> int:
    make_reviewer(world["owner"])
    park_calls(world["sid"], "c1")
    return Event.objects.count()


@pytest.mark.parametrize(("frame", "named"), BAD)
async def test_a_bad_value_is_an_error_frame_with_a_code_and_nothing_is_appended(
    world: dict[str, Any], frame: dict[str, Any], named: str
) -> None:
    before = await db(_setup)(world)
    comm = await open_socket(f"/ws/sessions/{world['sid']}/?token={world['token']}")
    await synced(comm)
    await send(comm, {**frame, "id": "x"})
    reply = (await recv_until(comm, lambda f: f.get("id") == "x"))[-1]
    assert (reply["type"], reply["code"]) == ("error", "invalid_input"), reply
    assert named in reply["message"]
    assert await db(Event.objects.count)() == before
    assert await db(Schedule.objects.count)() == 0
    await comm.disconnect()
