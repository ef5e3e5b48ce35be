"""Issue 17's pages in a real browser (daphne, its in-process worker, the
offline demo model, Debian's chromium), each at 1280 and 375 px: Markdown and
an XSS list, Back then send, an oversize message, Stop by button and by Esc,
the follow-up lane, rename / archive / search with the list following live,
the context view and its model picker, a token from the settings page used
with the API, the styled error pages, and suggestion chips."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.fixtures import assert_in_sync

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

WIDTHS = [1280, 375]
# Each would set window.__xss (or open a dialog) if it ran.
XSS = [
    "<script>window.__xss = 1</script>",
    '<img src=x onerror="window.__xss = 2">',
    '<svg onload="window.__xss = 3"></svg>',
    '<iframe srcdoc="<script>parent.__xss = 4</script>"></iframe>',
    "[click me](javascript:window.__xss=5)",
    '<a href="javascript:window.__xss=6" id="evil">evil</a>',
    "<style>body { display: none }</style>",
    '<details open ontoggle="window.__xss = 7">x</details>',
    '<math><mtext><table><mglyph><style><img src=x onerror="window.__xss=8">',
    '<input autofocus onfocus="window.__xss = 9">',
]


def no_horizontal_scroll(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def open_session(start_server: Callable[..., Any], make_user: Callable[..., Any], profile: Any, **env: Any) -> Any:
    from sessions_app import services

    server = start_server(TERRET_WORKER="inprocess", **env)
    alice = make_user("alice")
    return server, alice, services.create_session(alice, profile)


def texts(session: Any, kind: str) -> list[str]:
    from sessions_app.models import Event

    return [d.get("text", "") for d in Event.objects.filter(session=session, kind=kind).values_list("data", flat=True)]


@pytest.mark.parametrize("width", WIDTHS)
def test_markdown_renders_and_the_xss_list_stays_inert(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app import log

    server, alice, session = open_session(start_server, make_user, demo_profile)
    log.append(session.id, "context/injected", {"text": "Rendered on load:\n\n" + "\n\n".join(XSS)})
    page = new_page(server, alice, width=width)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")

    # The demo model echoes what it is told: its streamed reply becomes
    # Markdown once the message commits.
    page.get_by_label("Message").fill("Hello: **bold words** and `inline code`")
    page.get_by_role("button", name="Send", exact=True).click()
    reply = page.locator("#log .k-assistant-message .md").last
    expect(reply.locator("strong")).to_have_text("bold words", timeout=30_000)
    expect(reply.locator("code")).to_have_text("inline code")
    expect(page.locator("#streaming")).to_be_hidden()

    # Committed while the page is open: the socket's render is as safe as the page's.
    fence = "```"
    log.append(
        session.id,
        "assistant/message",
        {"content": f"Live:\n\n{fence}python\nprint('copied')\n{fence}\n\n" + "\n\n".join(XSS), "tool_calls": []},
    )
    block = page.locator("#log .code-block").last
    expect(block).to_contain_text("print('copied')")
    block.get_by_role("button", name="Copy").click()
    expect(block.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()").strip() == "print('copied')"

    page.locator("#log").get_by_text("click me").first.click(no_wait_after=True)  # an inert link goes nowhere
    page.wait_for_timeout(500)
    assert page.evaluate("window.__xss") is None and dialogs == []
    assert page.locator("#log script, #log img, #log svg, #log iframe, #log style, #log input").count() == 0
    assert page.locator("#log [href^='javascript' i]").count() == 0
    expect(page.locator("body")).to_be_visible()  # the <style> did not hide the page
    assert no_horizontal_scroll(page)
    assert_in_sync(page, session.id)
    assert page.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_back_then_send_sends(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    server, alice, session = open_session(start_server, make_user, demo_profile)
    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    page.get_by_label("Message").fill("first message")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#log .k-turn-end")).to_have_count(1, timeout=30_000)

    page.get_by_role("link", name="Sessions", exact=True).click()
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    response = page.go_back()
    assert response is not None and response.headers.get("cache-control") == "no-store"  # not from a cache
    expect(page.locator("#live")).to_have_text("live")
    # Playwright's Chromium runs without the back/forward cache; a page restored
    # from it fires pageshow with persisted set, and gets a fresh key.
    key = page.locator("#composer input[name=key]")
    before = key.input_value()
    page.evaluate("window.dispatchEvent(new PageTransitionEvent('pageshow', {persisted: true}))")
    assert re.fullmatch(r"[0-9a-f]{32}", key.input_value()) and key.input_value() != before
    page.get_by_label("Message").fill("second message, after Back")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#log .k-turn-end")).to_have_count(2, timeout=30_000)
    assert texts(session, "user/message") == ["first message", "second message, after Back"]
    expect(page.locator("#composer .error")).to_have_count(0)
    assert page.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_an_oversize_message_is_refused_visibly_and_kept_whole(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app.services import MAX_INPUT_CHARS

    server, alice, session = open_session(start_server, make_user, demo_profile)
    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    box = page.get_by_label("Message")
    box.fill("a" * (MAX_INPUT_CHARS + 1))  # a long paste
    assert page.evaluate("document.getElementById('id_text').value.length") == MAX_INPUT_CHARS + 1  # never cut
    expect(page.locator("#char-count")).to_contain_text("too long by 1")
    page.get_by_role("button", name="Send", exact=True).click()
    box.press("Enter")
    page.wait_for_timeout(500)
    assert texts(session, "user/message") == []
    assert page.evaluate("document.getElementById('id_text').value.length") == MAX_INPUT_CHARS + 1

    # The server refuses it too (a client without the counter): the error shows in the form.
    page.evaluate("document.getElementById('id_text').removeAttribute('data-max-chars')")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#composer .error")).to_contain_text("Too long")
    assert page.evaluate("document.getElementById('id_text').value.length") == MAX_INPUT_CHARS + 1
    assert texts(session, "user/message") == []

    box = page.get_by_label("Message")
    box.fill("short enough")
    expect(page.locator("#char-count")).to_have_text(f"12 / {MAX_INPUT_CHARS:,}")
    box.press("Enter")
    expect(page.locator("#log li.k-user-message")).to_contain_text("short enough")
    assert no_horizontal_scroll(page)
    assert page.js_errors == []


@pytest.mark.parametrize(("width", "how"), [(1280, "escape"), (375, "button")])
def test_stop_from_the_composer_and_the_follow_up_lane(
    width: int,
    how: str,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app.models import Event

    server, alice, session = open_session(start_server, make_user, demo_profile, TERRET_DEMO_DELAY="0.15")
    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    page.get_by_label("Message").fill("tell me a long story about the sea, the wind and the boats in the harbour")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#streaming")).to_be_visible(timeout=20_000)
    stop = page.locator("#stop-button")
    expect(stop).to_be_visible()
    expect(stop).to_be_in_viewport()  # beside the composer, not a long scroll away

    # While it runs: "Send after this turn" waits for the turn to end.
    page.get_by_label("Message").fill("what time is it?")
    page.get_by_role("button", name="Send after this turn").click()
    expect(page.locator("#composer")).to_contain_text("new turn when this one ends")
    expect(page.locator("#log li.k-input-deferred.queued")).to_contain_text("sent when this turn ends")

    if how == "escape":
        page.keyboard.press("Escape")
    else:
        stop.click()
    expect(page.locator("#log .k-turn-end").first).to_contain_text("Turn cancelled", timeout=30_000)
    expect(page.locator("#log .k-assistant-message.partial")).to_have_count(1)
    # The follow-up then opens its own turn, and the clock answers it.
    expect(page.locator("#log .k-turn-end")).to_have_count(2, timeout=30_000)
    expect(page.locator("#log .tool-card .call-state").last).to_contain_text("done")
    expect(page.locator("#log li.k-input-deferred.queued")).to_have_count(0)  # placed: no longer waiting
    assert Event.objects.filter(session=session, kind="turn/cancel_requested").count() == 1
    assert texts(session, "user/message")[-1] == "what time is it?"
    expect(stop).to_be_hidden()
    assert no_horizontal_scroll(page)
    assert page.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_rename_archive_search_and_the_list_follows_live(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app import log, services
    from sessions_app.models import Agent, Session

    server, alice, session = open_session(start_server, make_user, demo_profile)
    other = services.create_session(alice, demo_profile)
    log.append(other.id, "session/titled", {"title": "Porto notes"})
    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    page.locator("#chat-menu > summary").click()  # rename and archive are in the header's menu
    page.get_by_text("Rename", exact=True).click()
    page.get_by_label("New title").fill("Lisbon plans")
    page.get_by_role("button", name="Save title").click()
    expect(page.locator("#session-title")).to_have_text("Lisbon plans")  # over the socket
    expect(page).to_have_title(re.compile("^Lisbon plans"))
    assert Session.objects.get(id=session.id).title == "Lisbon plans"

    page.get_by_role("link", name="Sessions", exact=True).click()
    page.get_by_label("Search titles").fill("lisbon")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("#session-list tbody tr")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("Lisbon plans")

    # The plain list follows live: a session titled elsewhere shows up without a reload.
    page.get_by_role("link", name="Clear").click()
    expect(rows).to_have_count(2)
    page.wait_for_timeout(1000)  # the socket connects
    third = services.create_session(alice, demo_profile)
    log.append(third.id, "session/titled", {"title": "Arrived live"})
    expect(page.locator("#session-list")).to_contain_text("Arrived live", timeout=10_000)
    assert no_horizontal_scroll(page)

    page.get_by_role("link", name="Lisbon plans").click()
    page.locator("#chat-menu > summary").click()
    page.get_by_role("button", name="Archive").click()
    expect(page.locator(".messages")).to_contain_text("Archived “Lisbon plans”")
    expect(page.locator("#session-list")).not_to_contain_text("Lisbon plans")
    assert not Agent.objects.filter(session=session).exists()
    page.get_by_role("link", name="Archived").click()
    expect(page.locator("#session-list")).to_contain_text("Lisbon plans")
    assert no_horizontal_scroll(page)
    assert page.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_the_context_view_and_the_model_picker(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app.models import Event

    server, alice, session = open_session(start_server, make_user, demo_profile)
    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    page.get_by_label("Message").fill("remember the blue door")
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#log .k-turn-end")).to_have_count(1, timeout=30_000)
    # The panel on the chat page (in the side panel) loads when opened...
    page.locator("#panel-button").click()
    page.locator("#context-panel > summary").click()
    expect(page.locator("#context-panel #context-messages")).to_contain_text("remember the blue door")
    expect(page.locator("#context-panel #context-model")).to_have_text("demo/offline")
    assert no_horizontal_scroll(page)
    # ... and the page of its own holds the same, with the picker.
    page.locator("#panel-close").click()
    page.locator("#chat-menu > summary").click()
    page.get_by_role("link", name="Context", exact=True).click()
    expect(page.get_by_role("heading", name="What the model sees next")).to_be_visible()
    expect(page.locator("#context-model")).to_have_text("demo/offline")
    messages = page.locator("#context-messages > li")
    expect(messages.first).to_contain_text("system")
    expect(page.locator("#context-messages")).to_contain_text("remember the blue door")
    expect(page.locator("#context-tools")).to_contain_text("workspace.write")
    expect(page.locator("#context-tools li", has_text="workspace.write")).to_contain_text("asks for approval")
    expect(page.locator("#context-total")).to_contain_text(re.compile(r"About \d+ tokens"))
    assert no_horizontal_scroll(page)

    page.get_by_label(re.compile("Use another model")).fill("demo/other")
    page.get_by_role("button", name="Set model").click()
    expect(page.locator(".messages")).to_contain_text("the next step uses demo/other")
    expect(page.locator("#context-model")).to_have_text("demo/other")
    assert Event.objects.get(session=session, kind="model/updated").data == {
        "role": "main",
        "spec": "demo/other",
        "by": "alice",
    }
    assert page.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_a_token_from_the_settings_page_works_with_the_api(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    server, alice, session = open_session(start_server, make_user, demo_profile)
    page = new_page(server, alice, width=width)
    page.goto("/")
    page.get_by_role("link", name="Settings").click()
    page.get_by_label("Name").fill("my script")
    page.get_by_role("button", name="Create token").click()
    raw = page.locator("#new-token").inner_text().strip()
    assert raw.startswith("trt_")
    assert no_horizontal_scroll(page)

    # As a program would (curl): the token reads the session and sends to it.
    auth = {"Authorization": f"Bearer {raw}"}
    r = httpx.get(f"{server.url}/api/sessions/{session.id}/events", headers=auth, timeout=10)
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{server.url}/api/sessions/{session.id}/inputs", headers=auth, json={"text": "hi from curl"}, timeout=10
    )
    assert r.status_code in (200, 201, 202), r.text
    assert "hi from curl" in texts(session, "user/message") + texts(session, "input/queued")

    page.get_by_role("link", name="Settings").click()
    expect(page.locator("#new-token")).to_have_count(0)  # shown once
    page.locator("#token-table tr", has_text="my script").get_by_role("button", name="Revoke").click()
    expect(page.locator(".messages")).to_contain_text("Revoked the token")
    r = httpx.get(f"{server.url}/api/sessions/{session.id}/events", headers=auth, timeout=10)
    assert r.status_code == 401
    assert page.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_error_pages_favicon_and_suggestions(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    server, alice, session = open_session(start_server, make_user, demo_profile)
    bob = make_user("bob")
    page = new_page(server, bob, width=width)
    r = page.goto("/approvals/")  # bob is no reviewer
    assert r is not None and r.status == 403
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    assert no_horizontal_scroll(page)
    r = page.goto(f"/sessions/{session.id}/")  # not his: the same as none
    assert r is not None and r.status == 404
    expect(page.get_by_role("heading", name="Nothing here")).to_be_visible()
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon and httpx.get(server.url + icon, timeout=10).status_code == 200
    assert "Traceback" not in server.output()

    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    chips = page.locator("#suggestions .chip")
    expect(chips.first).to_be_visible()
    page.get_by_role("button", name="What time is it?").click()
    expect(page.locator("#log .tool-card")).to_contain_text("clock.now", timeout=30_000)
    expect(page.locator("#suggestions")).to_be_hidden()
    assert no_horizontal_scroll(page)
    assert page.js_errors == []
