"""Issue 34, part 1, in a real browser at 1280 and 375 px (daphne, its
in-process worker, Debian's chromium): the chat opens at its newest message
and follows new ones unless the reader scrolled up, then a "new messages"
pill; one header line with a menu and a side panel (a sheet on a phone) for
context, budget and schedules; one assistant bubble per turn; hover actions;
highlighted code with its language; dark mode; the composer's notice clears
when its input is answered."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

WIDTHS = [1280, 375]
# Where the screenshots go when TERRET_SCREENSHOTS names a folder (to look at by hand).
SHOTS = os.environ.get("TERRET_SCREENSHOTS", "")

AT_BOTTOM = "window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 150"


def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / name), full_page=False)


def long_session(alice: Any, profile: Any, turns: int = 25) -> Any:
    from sessions_app import log, services

    session = services.create_session(alice, profile)
    log.append(session.id, "session/titled", {"title": "A long talk about harbours"})
    for i in range(turns):
        log.append(session.id, "turn/start", {"by": "test"})
        log.append(session.id, "user/message", {"text": f"question {i}: tell me about harbour {i}"})
        log.append(session.id, "step/start", {"step": 1, "model": "demo/offline"})
        call = {"id": f"c{i}", "name": "clock.now", "arguments": "{}"}
        log.append(
            session.id, "assistant/message", {"content": f"Let me check the time for {i}.", "tool_calls": [call]}
        )
        log.append(
            session.id, "tool/result", {"call_id": f"c{i}", "name": "clock.now", "content": "12:00", "is_error": False}
        )
        log.append(
            session.id, "step/end", {"step": 1, "usage": {"prompt_tokens": 5, "completion_tokens": 3, "cost": 0.001}}
        )
        log.append(session.id, "step/start", {"step": 2, "model": "demo/offline"})
        text = f"Harbour {i} is calm.\n\n```python\ndef harbour():\n    return {i}\n```"
        log.append(session.id, "assistant/message", {"content": text, "tool_calls": []})
        log.append(
            session.id, "step/end", {"step": 2, "usage": {"prompt_tokens": 5, "completion_tokens": 3, "cost": None}}
        )
        log.append(session.id, "turn/end", {"status": "completed"})
    return session


@pytest.mark.parametrize("width", WIDTHS)
def test_the_chat_opens_at_its_newest_message_and_follows_with_a_pill(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app import log

    server = start_server(TERRET_WORKER="inprocess")
    alice = make_user("alice")
    session = long_session(alice, demo_profile)
    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    assert page.evaluate("document.documentElement.scrollHeight > 3 * window.innerHeight")  # a long page
    assert page.evaluate(AT_BOTTOM), "the chat must open at its newest message"
    expect(page.locator("#log .k-assistant-message").last).to_contain_text("Harbour 24 is calm")
    expect(page.locator("#log .k-assistant-message").last).to_be_in_viewport()
    shot(page, f"chat-bottom-{width}.png")

    # At the bottom, a new message is followed, and no pill shows.
    log.append(session.id, "context/injected", {"text": "followed while at the bottom"})
    expect(page.locator("#log .k-context-injected").last).to_contain_text("followed while at the bottom")
    page.wait_for_function(AT_BOTTOM)
    expect(page.locator("#new-messages")).to_be_hidden()

    # Scrolled up, the reader stays put and the pill says there is more.
    page.evaluate("window.scrollTo(0, 0)")
    log.append(session.id, "context/injected", {"text": "arrived while reading above"})
    pill = page.locator("#new-messages")
    expect(pill).to_be_visible()
    expect(pill).to_have_text("New messages ↓")
    assert page.evaluate("window.scrollY") < 50
    shot(page, f"chat-pill-{width}.png")
    pill.click()
    page.wait_for_function(AT_BOTTOM)
    expect(pill).to_be_hidden()
    expect(page.locator("#log .k-context-injected").last).to_be_in_viewport()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_one_header_line_a_menu_a_side_panel_and_one_bubble_per_turn(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    server = start_server(TERRET_WORKER="inprocess")
    alice = make_user("alice")
    session = long_session(alice, demo_profile, turns=2)
    page = new_page(server, alice, width=width)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")

    # One line of header: title, state, cost, Details and the menu.
    line = page.locator("#chat-head .head-line")
    assert line.bounding_box()["height"] < 60
    expect(page.locator("#cost")).to_have_text("$0.0020 + 2 unpriced")
    for hidden in ("#budget", "#schedules", "#context-panel", "#compact-button", "#archive-button"):
        expect(page.locator(hidden)).to_be_hidden()
    page.locator("#chat-menu > summary").click()
    expect(page.locator("#compact-button")).to_be_visible()
    expect(page.locator("#archive-button")).to_be_visible()
    menu = page.locator("#chat-menu .menu-body").bounding_box()
    assert menu["x"] >= 0 and menu["x"] + menu["width"] <= width, menu  # the menu fits the screen
    shot(page, f"chat-menu-{width}.png")
    page.locator("#chat-menu > summary").click()

    # The side panel (a sheet on a phone) holds context, budget and schedules; the budget form fits.
    page.locator("#panel-button").click()
    panel = page.locator("#side-panel")
    expect(panel).to_be_visible()
    page.locator("#budget summary").click()
    form = page.locator("#budget-form")
    expect(form).to_be_visible()
    box = form.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, box
    for field in ("#id_cost_usd", "#id_turns"):
        b = page.locator(field).bounding_box()
        assert b["x"] + b["width"] <= width, (field, b)
    page.locator("#schedules summary").click()
    expect(page.locator("#schedule-form")).to_be_visible()
    expect(page.locator("#schedule_due_at")).to_be_visible()
    page.locator("#files summary").click()
    expect(page.locator("#files")).to_contain_text("No files yet")
    if width < 700:
        pb = panel.bounding_box()
        assert pb["y"] > 0 and abs(pb["width"] - width) < 2  # a sheet from the bottom
    shot(page, f"chat-panel-{width}.png")
    page.locator("#panel-close").click()
    expect(panel).to_be_hidden()

    # One assistant bubble per turn: the second step continues the first's bubble.
    replies = page.locator("#log > li.k-assistant-message")
    expect(replies).to_have_count(4)
    expect(page.locator("#log > li.k-assistant-message.cont")).to_have_count(2)
    for i in range(2):
        expect(page.locator("#log > li.k-assistant-message.cont .ev-head").nth(i)).to_be_hidden()

    # Code is highlighted on the server and labelled with its language.
    block = page.locator("#log .code-block").last
    expect(block.locator(".code-lang")).to_have_text("python")
    expect(block.locator("code .k")).to_have_text(["def", "return"])
    keyword_colour = block.locator("code .k").first.evaluate("e => getComputedStyle(e).color")
    plain_colour = block.locator("code").evaluate("e => getComputedStyle(e).color")
    assert keyword_colour != plain_colour

    # Hover actions: copy a whole message; edit and resend; regenerate.
    last = replies.last
    last.hover()
    copy = last.get_by_role("button", name="Copy the whole text")
    expect(copy).to_be_visible()
    expect(last.get_by_role("button", name="Regenerate")).to_be_visible()
    copy.click()
    expect(copy).to_have_attribute("data-label", "Copied")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.startswith("Harbour 1 is calm.") and "```python" in copied
    mine = page.locator("#log > li.k-user-message").last
    mine.hover()
    expect(mine.get_by_role("button", name="Edit and resend")).to_be_visible()
    shot(page, f"chat-light-{width}.png")

    # Dark mode follows the system.
    light_bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.emulate_media(color_scheme="dark")
    dark_bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert light_bg != dark_bg
    channels = [int(x) for x in dark_bg[dark_bg.index("(") + 1 : dark_bg.index(")")].split(",")[:3]]
    assert max(channels) < 60, dark_bg
    shot(page, f"chat-dark-{width}.png")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_the_two_lanes_land_where_their_labels_say_and_the_notice_clears(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app import services
    from sessions_app.models import Event

    server = start_server(TERRET_WORKER="inprocess", TERRET_DEMO_DELAY="0.15")
    alice = make_user("alice")
    session = services.create_session(alice, demo_profile)
    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    page.get_by_label("Message").fill("tell me a long story about the sea, the wind and the boats in the harbour")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#streaming")).to_be_visible(timeout=20_000)

    # Both lanes in one reply, the follow-up first: each lands where its label says.
    page.get_by_label("Message").fill("FOLLOW after the turn")
    page.get_by_role("button", name="Send after this turn").click()
    notice = page.locator("#composer-notice")
    expect(notice).to_contain_text("new turn when this one ends")
    page.get_by_label("Message").fill("STEER right now")
    page.get_by_role("button", name="Steer now").click()
    expect(notice).to_contain_text("rides the agent's next step")
    deferred = list(Event.objects.filter(session=session, kind="input/deferred").values_list("data", flat=True))
    queued = list(Event.objects.filter(session=session, kind="input/queued").values_list("data", flat=True))
    assert [(d["text"], d["lane"]) for d in deferred] == [("FOLLOW after the turn", "follow_up")]
    assert [d["text"] for d in queued] == ["STEER right now"]
    expect(page.locator("#log li.k-input-deferred")).to_contain_text("After this turn")
    # The steer is answered (it lands in the running turn): the notice clears.
    expect(page.locator("#log li.k-context-injected")).to_contain_text("STEER right now", timeout=30_000)
    expect(notice).to_be_empty()
    expect(page.locator("#log li.k-user-message").last).to_contain_text("FOLLOW after the turn", timeout=60_000)
    shot(page, f"chat-lanes-{width}.png")
    assert page.js_errors == []
