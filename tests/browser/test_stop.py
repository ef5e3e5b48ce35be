"""Stop in a real browser, against daphne (turns on its in-process pool) and
a fake model provider that streams slowly: the composer shows Stop only
while a turn is open, Esc presses it, and a Stop mid-stream ends the turn
cancelled within 2 s with the text streamed so far kept (marked stopped)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.fixtures import assert_in_sync
from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

STORY = " ".join(f"word{i}" for i in range(400))


@pytest.fixture
def slow_profile(transactional_db: None) -> Any:
    from sessions_app.models import AgentProfile

    # main goes to the fake provider; the titler stays offline so it never takes a scripted reply.
    return AgentProfile.objects.create(name="slow", roles={"main": "test/model", "titler": "demo/offline"})


def open_chat(
    start_server: Callable[..., Any], new_page: Callable[..., Any], make_user: Callable[..., Any], profile: Any
) -> tuple[Any, Any]:
    from sessions_app import services

    server = start_server(TERRET_WORKER="inprocess")
    alice = make_user("alice")
    session = services.create_session(alice, profile)
    page = new_page(server, alice)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    return page, session


def test_stop_shows_while_a_turn_runs_and_esc_presses_it(
    fake_llm: Any,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    slow_profile: Any,
) -> None:
    from sessions_app.models import Event

    fake_llm.script(Reply(text=" ".join(f"w{i}" for i in range(100)), chunk_delay=0.05))  # about 5 s of stream
    page, session = open_chat(start_server, new_page, make_user, slow_profile)
    stop = page.locator("#stop-button")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible()
    expect(stop).to_be_hidden()  # idle: Send only

    page.get_by_label("Message").fill("tell me a story")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#chat-facts")).to_have_attribute("data-status", "running")
    expect(stop).to_be_visible()
    expect(page.locator("#streaming")).to_be_visible(timeout=20_000)

    page.keyboard.press("Escape")
    expect(page.locator("#log .k-turn-cancel_requested")).to_contain_text("Cancel requested by alice")
    assert Event.objects.filter(session=session, kind="turn/cancel_requested").count() == 1
    # However soon the runtime stops the stream, the turn ends cancelled and Stop goes away.
    expect(page.locator("#log .k-turn-end")).to_contain_text("Turn cancelled", timeout=30_000)
    expect(page.locator("#chat-facts")).to_have_attribute("data-status", "idle")
    expect(stop).to_be_hidden()
    page.keyboard.press("Escape")  # idle: Esc does nothing
    time.sleep(0.5)
    assert Event.objects.filter(session=session, kind="turn/cancel_requested").count() == 1
    assert page.js_errors == []


def test_stop_mid_stream_ends_cancelled_within_two_seconds_keeping_the_partial_text(
    fake_llm: Any,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    slow_profile: Any,
) -> None:
    from sessions_app.models import Event

    fake_llm.script(Reply(text=STORY, chunk_delay=0.05))  # 20 s of stream
    page, session = open_chat(start_server, new_page, make_user, slow_profile)
    page.get_by_label("Message").fill("tell me a long story")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#stream-text")).to_contain_text("word5 ", timeout=20_000)

    started = time.monotonic()
    page.locator("#stop-button").click()
    end = page.locator("#log .k-turn-end")
    expect(end).to_contain_text("Turn cancelled", timeout=2_000)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"the turn took {elapsed:.2f} s to end"

    reply = page.locator("#log .k-assistant-message.partial")
    expect(reply).to_have_count(1)
    expect(reply.locator(".mark.stopped")).to_have_text("stopped")
    kept = reply.locator(".text").inner_text()
    assert kept.startswith("word0 word1 word2 word3 word4 word5") and len(kept) < len(STORY)
    [message] = Event.objects.filter(session=session, kind="assistant/message").values_list("data", flat=True)
    assert message["partial"] is True and STORY.startswith(message["content"].rstrip())
    expect(page.locator("#stop-button")).to_be_hidden()
    expect(page.locator("#status")).to_have_text("idle")
    expect(page.locator("#streaming")).to_be_hidden()
    assert re.search(r"cancelled", end.inner_text())
    assert_in_sync(page, session.id)
    assert page.js_errors == []
