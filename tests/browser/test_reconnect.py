"""The server process dies mid-turn and comes back: the page reconnects with
?after=<last seq> and ends up showing every event exactly once, in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.fixtures import assert_in_sync

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.postgres, pytest.mark.redis]

STORY = "please tell me about " + " ".join(f"item{i}" for i in range(60))


def test_reconnect_after_server_restart_mid_turn(
    start_worker: Callable[..., Any],
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app import services
    from sessions_app.models import Session

    # The turn runs in the worker process, which outlives the web server.
    start_worker(TERRET_DEMO_DELAY="0.05")
    server = start_server()
    alice = make_user("alice")
    session = services.create_session(alice, demo_profile)
    page = new_page(server, alice)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")

    page.get_by_label("Message").fill(STORY)
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator("#streaming")).to_be_visible(timeout=20_000)  # mid-turn, mid-step

    server.kill()  # SIGKILL: no close frame, the socket just dies
    expect(page.locator("#live")).to_have_text("reconnecting…")
    shown_before = page.evaluate("window.terretLive.lastSeq()")
    # Committed while no server is up: the page can only learn of it by
    # catching up from the database after it reconnects.
    receipt = services.inject(session.id, "a steer sent while the server was down", wake=True, by="alice")
    assert receipt.disposition == "queued"
    assert receipt.seq > shown_before

    server.start()  # same port: the page's backoff finds it again
    expect(page.locator("#live")).to_have_text("live", timeout=20_000)
    expect(page.locator(f"#ev-{receipt.seq}")).to_contain_text("a steer sent while the server was down")
    # The first turn finishes live, then the steer opens the next one.
    expect(page.locator("#log .k-turn-end")).to_have_count(2, timeout=30_000)
    expect(page.locator("#status")).to_have_text("idle")

    shown = assert_in_sync(page, session.id)
    assert [seq for seq, _ in shown] == list(range(1, Session.objects.get(id=session.id).last_seq + 1))
    assert page.evaluate("window.__sameDocument") is True  # caught up without a reload
    assert page.js_errors == []
