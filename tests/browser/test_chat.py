"""A chat end to end in a real browser, against daphne and a real worker."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.fixtures import assert_in_sync, logged_events, rendered_events

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

# Records whether token deltas were ever streamed into the page.
WATCH_STREAM = """() => {
  window.__streamed = "";
  const el = document.getElementById("streaming");
  new MutationObserver(() => {
    const t = el.querySelector(".text").textContent;
    if (!el.hidden && t.length > window.__streamed.length) window.__streamed = t;
  }).observe(el, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


@pytest.mark.parametrize("mode", ["celery", "inprocess"])
def test_chat_end_to_end_with_a_tool_call(
    mode: str,
    request: pytest.FixtureRequest,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app.models import Session

    if mode == "celery":
        request.getfixturevalue("start_worker")(TERRET_DEMO_DELAY="0.01")
    server = start_server(TERRET_WORKER=mode)
    make_user("alice")
    page = new_page(server)

    # Sign in through the login form.
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("pw-alice")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()

    # A new session from the demo profile.
    page.get_by_role("link", name="New session").click()
    page.get_by_label(re.compile("demo")).check()
    page.get_by_role("button", name="Start session").click()
    expect(page).to_have_url(re.compile(r"/sessions/[0-9a-f-]{36}/$"))
    session = Session.objects.get(owner__username="alice")
    expect(page.locator("#live")).to_have_text("live")
    page.evaluate(WATCH_STREAM)

    # Enter sends; the demo model calls clock.now, then answers from its result.
    box = page.get_by_label("Message")
    box.fill("what time is it?")
    box.press("Enter")
    expect(page.locator("#log .k-turn-end")).to_have_text(re.compile("Turn completed"), timeout=30_000)
    call = page.locator("#log details.tool-card")
    expect(call).to_have_count(1)  # one card: the call, its result and its time
    expect(call.locator("summary")).to_contain_text("clock.now")
    expect(call.locator(".call-state")).to_contain_text("done")
    result = call.locator(".card-result")
    expect(result).to_contain_text("Result")
    reply = page.locator("#log .k-assistant-message .text").last
    expect(reply).to_contain_text("clock.now returned")
    expect(page.locator("#status")).to_have_text("idle")
    expect(page.locator("#cost")).to_have_text(re.compile(r"^\$\d+\.\d{4}"))
    expect(page.locator("#streaming")).to_be_hidden()  # replaced by the durable message
    assert "clock.now returned" in page.evaluate("window.__streamed")

    expect(page.get_by_label("Message")).to_have_value("")

    # Every committed event exactly once, in order, and the same as a fresh
    # server render of the page.
    # The titler names the session after the first message; the title updates live.
    expect(page.locator("#session-title")).not_to_have_text("Untitled session", timeout=10_000)
    live = assert_in_sync(page, session.id)
    live_text = page.locator("#log > li.ev:not(.meta)").all_inner_texts()

    # Collapsible, and keyboard-usable: focus the summary and press Enter.
    expect(result.locator("pre")).to_be_hidden()
    call.locator("summary").focus()
    page.keyboard.press("Enter")
    expect(result.locator("pre")).to_be_visible()

    page.reload()
    assert rendered_events(page) == live
    assert page.locator("#log > li.ev:not(.meta)").all_inner_texts() == live_text
    assert page.js_errors == []


@pytest.mark.worker
def test_steer_is_shown_queued_until_it_lands(
    start_worker: Callable[..., Any],
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app import services

    # A slow demo model: the first reply streams for a few seconds.
    start_worker(TERRET_DEMO_DELAY="0.08")
    server = start_server()
    alice = make_user("alice")
    session = services.create_session(alice, demo_profile)
    page = new_page(server, alice, width=390)  # phone width
    page.goto(f"/sessions/{session.id}/")
    box = page.get_by_label("Message")
    box.fill("hello there, please tell me a story")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#streaming")).to_be_visible(timeout=20_000)
    # The worker can start streaming before the first POST's response swaps the
    # composer; typing into the old form would be lost to that swap.
    box = page.get_by_label("Message")
    expect(box).to_have_value("")
    expect(page.get_by_role("button", name="Steer now")).to_be_enabled()

    box.fill("and make it short")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_hidden()  # a turn runs: the two lanes instead
    page.get_by_role("button", name="Steer now").click()
    queued = page.locator("#log li.queued")
    expect(queued).to_have_count(1)
    expect(queued).to_contain_text("and make it short")
    expect(queued).to_contain_text("queued")
    expect(page.locator("#composer")).to_contain_text("Queued")

    # It lands (as the input of the next turn) and the queued row goes away.
    landed = page.locator("#log li.k-user-message", has_text="and make it short")
    expect(landed).to_be_visible(timeout=30_000)
    expect(queued).to_have_count(0)
    expect(page.locator("#log .k-turn-end")).to_have_count(2, timeout=30_000)
    assert_in_sync(page, session.id)
    # Phone width: nothing forces horizontal scrolling.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.js_errors == []


def fill_log(session_id: Any, count: int) -> None:
    from sessions_app import log

    with log.locked(session_id) as tx:
        for i in range(count):
            tx.append("context/injected", {"text": f"note {i + 1}"})


def test_long_history_pages_back_while_live(
    start_server: Callable[..., Any], new_page: Callable[..., Any], make_user: Callable[..., Any], demo_profile: Any
) -> None:
    from sessions_app import log, services
    from sessions_app.web.sessions import PAGE_SIZE

    server = start_server()
    alice = make_user("alice")
    session = services.create_session(alice, demo_profile)
    fill_log(session.id, 2 * PAGE_SIZE + 50)
    page = new_page(server, alice)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    assert len(rendered_events(page)) == PAGE_SIZE  # a bounded first page

    # htmx swaps each older page in above; the socket keeps appending below.
    total = len(logged_events(session.id))
    for pages in (2, 3):
        page.get_by_role("link", name="Load earlier events").click()
        expect(page.locator("#log > li.ev")).to_have_count(min(total, pages * PAGE_SIZE))
    expect(page.get_by_role("link", name="Load earlier events")).to_have_count(0)
    event = log.append(session.id, "context/injected", {"text": "arrived live"})
    expect(page.locator(f"#ev-{event.seq}")).to_contain_text("arrived live")
    shown = assert_in_sync(page, session.id)
    assert [seq for seq, _ in shown] == list(range(1, event.seq + 1))
    assert page.js_errors == []


def test_pages_work_without_javascript(
    start_server: Callable[..., Any], new_page: Callable[..., Any], make_user: Callable[..., Any], demo_profile: Any
) -> None:
    from sessions_app import services
    from sessions_app.models import Event
    from sessions_app.web.sessions import PAGE_SIZE

    server = start_server(TERRET_WORKER="inprocess")  # the turn the message starts runs in daphne
    alice = make_user("alice")
    session = services.create_session(alice, demo_profile)
    fill_log(session.id, PAGE_SIZE + 5)
    page = new_page(server, alice, js=False, width=390)
    page.goto("/")
    page.get_by_role("link", name="Untitled session").click()
    expect(page.locator("#live")).to_have_text("offline")  # nothing live without JS
    page.get_by_label("Message").fill("plain form post")
    page.get_by_role("button", name="Send", exact=True).click()  # POST, redirect, server render
    expect(page.locator("#log li.k-user-message")).to_contain_text("plain form post")
    assert Event.objects.filter(session=session, kind="user/message").count() == 1
    page.get_by_role("link", name="Load earlier events").click()  # a page of history
    expect(page).to_have_url(re.compile(r"\?before=\d+$"))
    first = Event.objects.filter(session=session, data__text="note 1").values_list("seq", flat=True).get()
    expect(page.locator(f"#ev-{first}")).to_contain_text("note 1")  # seq 1: the agent is spawned by the message
    expect(page.get_by_role("link", name="Jump to latest")).to_be_visible()
