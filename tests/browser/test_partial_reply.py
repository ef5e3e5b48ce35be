"""Reload mid-stream keeps the partial reply, in Chromium at 1280 and 375 px.

The model (FakeLLM at the HTTP boundary) streams a long reply slowly; the
page is reloaded in the middle of it. After the reload the streaming bubble
starts with the reply's first words (sent by the socket from the worker's
kept deltas: Redis when configured, memory for daphne's in-process worker),
before the message commits; then the durable message replaces the bubble,
and the log shows every event once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from sessions_app import services
from tests.browser.fixtures import assert_in_sync
from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

STORY = (
    "Once upon a time there was an append-only log. Every morning it woke up, remembered everything that had "
    "ever happened to it, and added one more line. The workers came and went, the sockets dropped and came back, "
    "but the log kept its order and told each of them exactly what they had missed."
)


@pytest.mark.parametrize(("store", "width"), [("redis", 1280), ("memory", 375), ("redis", 375), ("memory", 1280)])
def test_a_reload_mid_stream_shows_the_start_of_the_reply(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    fake_llm: Any,
    profile: Any,
    owner: Any,
    store: str,
    width: int,
) -> None:
    # memory: no Redis at all, the in-process worker shares daphne's memory.
    env = {"TERRET_WORKER": "inprocess"} | ({"REDIS_URL": ""} if store == "memory" else {})
    server = start_server(**env)
    fake_llm.script(Reply(text=STORY, chunk_delay=0.12))
    session = services.create_session(owner, profile)
    page = new_page(server, owner, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    page.locator("textarea[name=text]").fill("tell me a story")
    page.get_by_role("button", name="Send", exact=True).click()
    bubble = page.locator("#stream-text")
    expect(bubble).to_contain_text("there was an append-only log", timeout=30_000)

    page.reload()
    expect(page.locator("#live")).to_have_text("live")
    # The start is back, while the reply is still streaming (no message row yet).
    expect(bubble).to_contain_text("Once upon a time there was", timeout=5_000)
    assert page.locator("#log .k-assistant-message").count() == 0, "the reply ended before the check"
    assert bubble.inner_text().startswith("Once upon a time")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    # The durable message lands and supersedes the bubble.
    expect(page.locator("#log .k-assistant-message")).to_contain_text("exactly what they had missed", timeout=60_000)
    expect(bubble).to_have_text("")
    assert_in_sync(page, session.id)
    assert page.js_errors == []
