"""The chat page's socket (/ws/sessions/<id>/page/): every committed event
after ?after= as the chat template's `event` partial, in seq order, once,
as htmx out-of-band swaps; the header, a landed queued input and the
approvals brought up to date; token deltas into the bubble."""

from __future__ import annotations

import asyncio
import re

import pytest

from sessions_app import log
from sessions_app.log import hints
from tests.sessions_app.apiutil import make_reviewer, token_for
from tests.sessions_app.sockutil import closed_with, db, fresh_channel_layer, open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]
_ = fresh_channel_layer  # an autouse fixture

APPENDED = re.compile(r'<ol hx-swap-oob="beforeend:#log">\s*<li id="ev-(\d+)"')


def path(world, after=0, token=None):
    return f"/ws/sessions/{world['sid']}/page/?token={token or world['token']}&after={after}"


async def fragments_until(comm, predicate, timeout=10.0):  # noqa: ASYNC109
    got = []
    deadline = asyncio.get_running_loop().time() + timeout
    while not got or not predicate(got[-1]):
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise TimeoutError(f"no matching fragment; got {got[-3:]}")
        got.append(await comm.receive_from(timeout=left))
    return got


def appended(fragments):
    return [int(seq) for html in fragments for seq in APPENDED.findall(html)]


async def test_replays_from_after_then_follows_each_event_once_in_order(world):
    sid = world["sid"]
    await db(lambda: [log.append(sid, "input/queued", {"text": f"m{i}", "wake": False}) for i in range(3)])()
    comm = await open_socket(path(world, after=1))
    assert comm.connected
    first = await fragments_until(comm, lambda html: "ev-4" in html)
    assert appended(first) == [2, 3, 4]  # agent/spawned is seq 1: the page already shows it
    await db(log.append)(sid, "turn/start", {})
    more = await fragments_until(comm, lambda html: "ev-5" in html)
    assert appended(more) == [5]
    assert 'id="chat-facts" class="chat-facts" data-status="running" hx-swap-oob="true"' in more[-1]
    # the header follows the log: the turn is open, and no worker has taken it yet
    assert 'id="status" class="badge waiting_worker"' in more[-1]
    assert 'id="approvals" class="approvals" aria-label="Pending approvals" hx-swap-oob="true"' in more[-1]
    await comm.disconnect()


async def test_a_queued_input_that_lands_is_shown_landed(world):
    sid = world["sid"]
    queued = await db(log.append)(sid, "input/queued", {"text": "steer me", "wake": False})
    comm = await open_socket(path(world, after=queued.seq))
    await db(log.append)(sid, "turn/start", {})
    await db(log.append)(sid, "context/injected", {"text": "steer me", "source_seq": queued.seq})
    html = "".join(await fragments_until(comm, lambda h: "context-injected" in h))
    assert f'<li id="ev-{queued.seq}"' in html and 'hx-swap-oob="outerHTML"' in html
    assert "Queued (landed)" in html
    await comm.disconnect()


async def test_deltas_fill_the_bubble_and_its_message_empties_it(world):
    sid = world["sid"]
    comm = await open_socket(path(world))
    await db(log.append)(sid, "turn/start", {})
    await db(log.append)(sid, "step/start", {"step": 1, "model": "demo/offline"})
    await fragments_until(comm, lambda h: "k-step-start" in h)
    hints.publish_delta(sid, {"step": 1, "text": "Hel<lo"})
    start = await comm.receive_from(timeout=10)
    assert start == '<div class="text" id="stream-text" hx-swap-oob="true">Hel&lt;lo</div>'
    hints.publish_delta(sid, {"step": 1, "text": " there"})
    assert await comm.receive_from(timeout=10) == '<span hx-swap-oob="beforeend:#stream-text"> there</span>'
    await db(log.append)(sid, "assistant/message", {"content": "Hel<lo there", "tool_calls": []})
    landed = "".join(await fragments_until(comm, lambda h: "k-assistant-message" in h))
    assert '<div class="text" id="stream-text" hx-swap-oob="true"></div>' in landed
    hints.publish_delta(sid, {"step": 1, "text": "late"})  # its message is shown: dropped
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()


async def test_a_user_who_may_not_read_the_session_is_refused(world, make_user):
    stranger = await db(make_user)("stranger")
    comm = await open_socket(path(world, token=await db(token_for)(stranger)))
    assert await closed_with(comm) == 4404


async def test_a_reviewer_gets_the_parked_call_with_its_decision_form(world, make_user):
    sid = world["sid"]
    reviewer = await db(lambda: make_reviewer(make_user("rita")))()
    comm = await open_socket(path(world, token=await db(token_for)(reviewer)))
    await db(log.append)(sid, "turn/start", {})
    await db(log.append)(sid, "approval/requested", {"call_id": "w1", "name": "workspace.write", "args": {"path": "a"}})
    html = "".join(await fragments_until(comm, lambda h: "k-approval-requested" in h))
    assert 'data-call-id="w1"' in html and 'name="verdict" value="approve"' in html
    await comm.disconnect()


async def test_a_delta_of_the_next_step_survives_the_previous_steps_message(world):
    """Deltas come straight from the hub; a batch read from the database may
    trail them. The next step's bubble is not emptied by the previous step's
    message, and a second turn's steps (numbered from 1 again) stream too."""
    sid = world["sid"]
    comm = await open_socket(path(world))
    await db(log.append)(sid, "turn/start", {})
    await db(log.append)(sid, "step/start", {"step": 1, "model": "demo/offline"})
    await fragments_until(comm, lambda h: "k-step-start" in h)
    hints.publish_delta(sid, {"step": 2, "text": "next"})  # step 2 streams before its step/start is read
    assert await comm.receive_from(timeout=10) == '<div class="text" id="stream-text" hx-swap-oob="true">next</div>'
    await db(log.append)(sid, "assistant/message", {"content": None, "tool_calls": []})
    landed = "".join(await fragments_until(comm, lambda h: "k-assistant-message" in h))
    assert 'id="stream-text" hx-swap-oob="true"></div>' not in landed  # step 2's bubble is kept
    await db(log.append)(sid, "turn/end", {"status": "completed"})
    ended = "".join(await fragments_until(comm, lambda h: "k-turn-end" in h))
    assert 'id="stream-text" hx-swap-oob="true"></div>' in ended  # the turn is over: nothing streams
    await db(log.append)(sid, "turn/start", {})
    await fragments_until(comm, lambda h: "k-turn-start" in h)
    hints.publish_delta(sid, {"step": 1, "text": "again"})  # the next turn's step 1
    assert await comm.receive_from(timeout=10) == '<div class="text" id="stream-text" hx-swap-oob="true">again</div>'
    await comm.disconnect()
