"""The reviewer's queue in a real browser against a real daphne process:
requests and verdicts show up live, and the forms work with and without JS.
The browser fixtures are tests/browser/fixtures.py's (a plugin of the root
conftest)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals_app.selectors import pending
from sessions_app import services
from sessions_app.models import Event
from tests.approvals_app.conftest import park

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]


def test_queue_updates_live_for_every_reviewer(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    make_reviewer: Callable[..., Any],
    demo_profile: Any,
) -> None:
    server = start_server()
    rita, sam = make_reviewer("rita"), make_reviewer("sam")
    session = services.create_session(make_user("alice"), demo_profile)
    a, b = new_page(server, rita), new_page(server, sam)
    for page in (a, b):
        page.goto("/approvals/")
        expect(page.locator("#approval-queue")).to_contain_text("Nothing is waiting")
        page.evaluate("window.__sameDocument = true")
    a.wait_for_timeout(500)  # both sockets joined

    # A call parks (appended by this process: the hint crosses Redis to daphne).
    park(session.id, "c1", args={"path": "notes.txt", "content": "hello"})
    for page in (a, b):
        row = page.locator('#approval-queue li[data-call-id="c1"]')
        expect(row).to_contain_text("workspace.write", timeout=15_000)
        expect(row.locator("pre")).to_contain_text('"path": "notes.txt"')

    # Sam starts typing a reason; a live refresh (another call parks) keeps it.
    sam_reason = b.locator('#approval-queue li[data-call-id="c1"]').get_by_label("Reason")
    sam_reason.fill("half-typed")
    park(session.id, "c2", new_turn=False)
    expect(b.locator('#approval-queue li[data-call-id="c2"]')).to_have_count(1, timeout=15_000)
    expect(b.locator('#approval-queue li[data-call-id="c1"]').get_by_label("Reason")).to_have_value("half-typed")

    # Rita denies c1 with a reason; Sam's queue drops it without a reload.
    row = a.locator('#approval-queue li[data-call-id="c1"]')
    row.get_by_label("Reason").fill("not in this sprint")
    row.get_by_role("button", name="Deny").click()
    expect(a.locator('#approval-queue li[data-call-id="c1"]')).to_have_count(0)
    expect(b.locator('#approval-queue li[data-call-id="c1"]')).to_have_count(0, timeout=15_000)
    expect(b.locator('#approval-queue li[data-call-id="c2"]')).to_have_count(1)
    assert [c.call_id for c in pending(session.id)] == ["c2"]
    verdict = Event.objects.get(session=session, kind="approval/resolved").data
    grounds = verdict.pop("grounds")  # what rita's authority rested on (test_authority.py checks it)
    assert grounds["as"] == "reviewers" and grounds["group"] == "reviewers"
    assert verdict == {"call_id": "c1", "verdict": "deny", "reason": "not in this sprint", "by": "rita"}
    for page in (a, b):
        assert page.evaluate("window.__sameDocument") is True
        assert page.js_errors == []


def test_stale_second_click_says_already_decided(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    make_reviewer: Callable[..., Any],
    demo_profile: Any,
) -> None:
    server = start_server()
    session = services.create_session(make_user("alice"), demo_profile)
    park(session.id, "c1")
    late = new_page(server, make_reviewer("late"))
    late.goto("/approvals/")
    expect(late.locator("#approval-queue")).to_contain_text("workspace.write")
    # Keep late's page stale: its live refetches fail, as if the hint were lost.
    late.route("**/approvals/queue/", lambda route: route.abort())
    from approvals_app import services as approvals

    approvals.decide(session.id, "c1", "approve", user=make_reviewer("quick"))
    late.get_by_label("Reason").fill("looks fine")
    late.locator("#approval-queue").get_by_role("button", name="Deny").click()
    alert = late.locator("#approval-notice [role=alert]")
    expect(alert).to_contain_text("already decided (approve by quick)")
    expect(late.locator('#approval-queue li[data-call-id="c1"]')).to_have_count(0)
    assert [
        e["verdict"]
        for e in Event.objects.filter(session=session, kind="approval/resolved").values_list("data", flat=True)
    ] == ["approve"]


def test_queue_works_without_javascript(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    make_reviewer: Callable[..., Any],
    demo_profile: Any,
) -> None:
    server = start_server()
    session = services.create_session(make_user("alice"), demo_profile)
    park(session.id, "c1")
    page = new_page(server, make_reviewer("rita"), js=False)
    page.goto("/approvals/")
    page.get_by_role("button", name="Approve").click()
    expect(page.locator(".messages")).to_contain_text("Approved.")
    expect(page.locator("#approval-queue")).to_contain_text("Nothing is waiting")
    assert Event.objects.get(session=session, kind="approval/resolved").data["verdict"] == "approve"
