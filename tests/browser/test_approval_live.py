"""An approval, live: the owner watches the request appear; a reviewer in a
second browser approves it; the owner's page unparks without a reload."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from tests.browser.fixtures import assert_in_sync

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.postgres, pytest.mark.redis]


def test_reviewer_approves_and_the_users_page_unparks_live(
    start_worker: Callable[..., Any],
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app import services

    start_worker(TERRET_DEMO_DELAY="0.01")
    server = start_server()
    alice = make_user("alice")
    rita = make_user("rita")
    rita.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    session = services.create_session(alice, demo_profile)
    chat = f"/sessions/{session.id}/"

    user = new_page(server, alice)
    user.goto(chat)
    expect(user.locator("#live")).to_have_text("live")
    user.evaluate("window.__sameDocument = true")
    reviewer = new_page(server, rita)
    reviewer.goto(chat)
    expect(reviewer.locator("#live")).to_have_text("live")
    expect(reviewer.locator("#composer")).to_have_count(0)  # reviewers approve, they do not drive

    user.get_by_label("Message").fill("write notes.txt: hello from the browser")
    user.get_by_role("button", name="Send", exact=True).click()

    # The user sees the request appear and the turn park.
    expect(user.locator("#status")).to_have_text("waiting for approval", timeout=30_000)
    expect(user.locator("#approvals")).to_contain_text("workspace.write")
    expect(user.locator("#log .k-approval-requested")).to_contain_text("workspace.write")
    # One card for the call, which says it waits; the request's own row is quiet.
    card = user.locator("#log details.tool-card")
    expect(card).to_have_count(1)
    expect(card.locator(".call-state")).to_have_text("waiting for approval")
    expect(user.locator("#log .k-approval-requested")).to_be_hidden()
    expect(user.locator("#approvals").get_by_role("button", name="Approve")).to_have_count(0)

    # The reviewer's page shows it live too, with the decision buttons.
    expect(reviewer.locator("#status")).to_have_text("waiting for approval")
    approve = reviewer.locator("#approvals").get_by_role("button", name="Approve")
    expect(approve).to_be_visible()
    approve.click()

    # The user's page unparks live: verdict, tool result, reply, turn end.
    expect(user.locator("#log .k-approval-resolved")).to_have_text(re.compile("Approved by rita"), timeout=30_000)
    # The card follows live: approved by whom, the result, done.
    expect(card.locator(".card-approval")).to_contain_text("approved by rita")
    expect(card.locator(".card-result")).to_contain_text("wrote")
    expect(card.locator(".call-state")).to_contain_text("done")
    expect(user.locator("#log .k-turn-end")).to_have_text(re.compile("Turn completed"), timeout=30_000)
    expect(user.locator("#status")).to_have_text("idle")
    expect(user.locator("#approvals")).not_to_contain_text("workspace.write")
    expect(reviewer.locator("#approvals")).not_to_contain_text("workspace.write")
    assert user.evaluate("window.__sameDocument") is True  # no reload happened

    assert_in_sync(user, session.id)
    assert_in_sync(reviewer, session.id)
    assert user.js_errors == [] and reviewer.js_errors == []
