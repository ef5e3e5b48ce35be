"""Approvals in Chromium at 1280 and 375 px, against daphne with its
in-process worker and the offline demo model:

- approve with edits from the reviewer's queue: the tool receives the
  edited arguments (the file on disk), and the model is told;
- "Allow workspace.write for this session" from the inline approval on the
  chat page: the next write runs without asking; the policy editor lists it
  and "Ask again" takes it back;
- the navigation bar's pending count and the tab title, live;
- the queue and the policy editor as cards, nothing off-screen at 375 px.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals_app import services as approvals
from sessions_app import services
from sessions_app.models import Event
from tests.approvals_app.conftest import park
from tests.helpers import document_text

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

WIDTHS = [1280, 375]


def fits(page: Any) -> bool:
    """No horizontal scroll: nothing is wider than the viewport."""
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def on_screen(page: Any, locator: Any) -> None:
    """The element lies inside the viewport's width."""
    box = locator.bounding_box()
    width = page.viewport_size["width"]
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (box, width)


def send(page: Any, text: str) -> None:
    page.locator("textarea[name=text]").fill(text)  # the composer (not another form's text field)
    page.get_by_role("button", name="Send", exact=True).click()


@pytest.mark.parametrize("width", WIDTHS)
def test_edit_approve_from_the_queue_runs_the_edited_arguments(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    make_reviewer: Callable[..., Any],
    demo_profile: Any,
    tmp_path: Path,
    width: int,
) -> None:
    server = start_server(TERRET_WORKER="inprocess")
    alice, rita = make_user("alice"), make_reviewer("rita")
    session = services.create_session(alice, demo_profile)
    user = new_page(server, alice, width=width)
    user.goto(f"/sessions/{session.id}/")
    expect(user.locator("#live")).to_have_text("live")
    send(user, "write notes.txt: from the model")
    expect(user.locator("#status")).to_have_text("waiting for approval", timeout=30_000)

    reviewer = new_page(server, rita, width=width)
    reviewer.goto("/approvals/")
    expect(reviewer.locator("#pending-count")).to_have_text("1")
    expect(reviewer).to_have_title(re.compile(r"^\(1\) Approvals"))
    card = reviewer.locator(f'#approval-queue li.approval-card[data-session="{session.id}"]')
    expect(card.locator("pre.args")).to_contain_text('"content": "from the model"')
    card.get_by_text("Edit arguments").click()
    box = card.get_by_label("Arguments as JSON")
    expect(box).to_be_visible()
    assert fits(reviewer), f"the queue overflows at {width} px"
    for name in ("Approve", "Deny"):
        on_screen(reviewer, card.get_by_role("button", name=name, exact=True))
    reviewer.screenshot(path=str(tmp_path / f"queue-edit-{width}.png"), full_page=True)
    box.fill(json.dumps({"path": "notes.txt", "content": "edited in the browser"}, indent=2))
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(reviewer.locator("#approval-notice")).to_contain_text("Approved with your edits.")

    # The owner's page unparks live; the tool wrote the reviewer's text.
    expect(user.locator("#status")).to_have_text("idle", timeout=30_000)
    assert document_text(session.id, "notes.txt") == "edited in the browser"
    [result] = Event.objects.filter(session=session, kind="tool/result").values_list("data", flat=True)
    assert "A reviewer edited the arguments" in result["content"]
    [verdict] = Event.objects.filter(session=session, kind="approval/resolved").values_list("data", flat=True)
    assert verdict["edited_args"] == {"path": "notes.txt", "content": "edited in the browser"}
    # The count and the title follow live, without a reload.
    expect(reviewer.locator("#pending-count")).to_have_text("0", timeout=15_000)
    expect(reviewer).to_have_title(re.compile(r"^Approvals"))
    assert user.js_errors == [] and reviewer.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_a_bad_edit_is_refused_on_the_page_and_nothing_runs(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    make_reviewer: Callable[..., Any],
    demo_profile: Any,
    width: int,
) -> None:
    server = start_server(TERRET_WORKER="manual")
    session = services.create_session(make_user("alice"), demo_profile)
    park(session.id, "c1", args={"path": "a.txt", "content": "x"})
    reviewer = new_page(server, make_reviewer("rita"), width=width)
    reviewer.goto("/approvals/")
    card = reviewer.locator('#approval-queue li[data-call-id="c1"]')
    card.get_by_text("Edit arguments").click()
    card.get_by_label("Arguments as JSON").fill('{"path": "a.txt"}')
    card.get_by_role("button", name="Approve", exact=True).click()
    alert = reviewer.locator("#approval-notice [role=alert]")
    expect(alert).to_contain_text("do not fit workspace.write's parameters")
    expect(reviewer.locator('#approval-queue li[data-call-id="c1"]')).to_have_count(1)
    assert not Event.objects.filter(session=session, kind="approval/resolved").exists()
    assert fits(reviewer)


@pytest.mark.parametrize("width", WIDTHS)
def test_allow_for_session_from_the_chat_page(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    make_reviewer: Callable[..., Any],
    demo_profile: Any,
    tmp_path: Path,
    width: int,
) -> None:
    server = start_server(TERRET_WORKER="inprocess")
    alice, rita = make_user("alice"), make_reviewer("rita")
    session = services.create_session(alice, demo_profile)
    chat = f"/sessions/{session.id}/"
    user = new_page(server, alice, width=width)
    user.goto(chat)
    expect(user.locator("#live")).to_have_text("live")
    reviewer = new_page(server, rita, width=width)
    reviewer.goto(chat)
    expect(reviewer.locator("#live")).to_have_text("live")

    send(user, "write one.txt: first")
    allow = reviewer.locator("#approvals").get_by_role("button", name="Allow workspace.write for this session")
    expect(allow).to_be_visible(timeout=30_000)
    assert fits(reviewer), f"the chat page overflows at {width} px"
    on_screen(reviewer, allow)
    on_screen(reviewer, reviewer.locator("#approvals").get_by_role("button", name="Approve", exact=True))
    allow.click()
    expect(user.locator("#status")).to_have_text("idle", timeout=30_000)
    assert document_text(session.id, "one.txt") == "first"

    # The next write runs without asking.
    send(user, "write two.txt: second")
    expect(user.locator("#log .k-turn-end")).to_have_count(2, timeout=30_000)
    assert document_text(session.id, "two.txt") == "second"
    assert Event.objects.filter(session=session, kind="approval/requested").count() == 1

    # The policy editor shows the waiver, laid out for the width; Ask again takes it back.
    reviewer.goto(f"/sessions/{session.id}/policy/")
    waived = reviewer.locator(".waived-tools")
    expect(waived).to_contain_text("workspace.write")
    assert fits(reviewer), f"the policy editor overflows at {width} px"
    reviewer.screenshot(path=str(tmp_path / f"policy-{width}.png"), full_page=True)
    waived.get_by_role("button", name="Ask again").click()
    expect(reviewer.locator("#policy-editor")).to_contain_text("asks for approval again")
    expect(reviewer.locator(".waived-tools")).to_have_count(0)
    send(user, "write three.txt: third")
    expect(user.locator("#status")).to_have_text("waiting for approval", timeout=30_000)
    # The owner's editor (with its form) fits the width too.
    user.goto(f"/sessions/{session.id}/policy/")
    expect(user.get_by_role("button", name="Save policy")).to_be_visible()
    assert fits(user), f"the owner's policy editor overflows at {width} px"
    on_screen(user, user.get_by_label("Allowed tools, one pattern per line"))
    assert user.js_errors == [] and reviewer.js_errors == []


@pytest.mark.parametrize("width", WIDTHS)
def test_the_pending_count_is_live_in_the_nav_and_the_title(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    make_reviewer: Callable[..., Any],
    demo_profile: Any,
    width: int,
) -> None:
    server = start_server(TERRET_WORKER="manual")
    rita = make_reviewer("rita")
    session = services.create_session(make_user("alice"), demo_profile)
    page = new_page(server, rita, width=width)
    page.goto("/")
    badge = page.locator("#nav-approvals #pending-count")
    expect(badge).to_have_text("0")
    page.evaluate("window.__sameDocument = true")
    page.wait_for_timeout(500)  # the count socket joined
    # Calls park in this process: the hints cross Redis to daphne.
    park(session.id, "c1")
    park(session.id, "c2", new_turn=False)
    expect(badge).to_have_text("2", timeout=15_000)
    expect(page).to_have_title(re.compile(r"^\(2\) "))
    on_screen(page, badge)
    approvals.decide(session.id, "c1", "approve", user=rita)
    expect(badge).to_have_text("1", timeout=15_000)
    services.cancel(session.id)
    expect(badge).to_have_text("0", timeout=15_000)
    expect(page).not_to_have_title(re.compile(r"^\("))
    assert page.evaluate("window.__sameDocument") is True
    assert fits(page) and page.js_errors == []
