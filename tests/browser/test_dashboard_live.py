"""The dashboard, live: a commit elsewhere reaches the open page through the
/ws/dashboard/ hint and an htmx refetch, well before the 30 s poll; the
compact button works in place (htmx) on a real server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]


def test_dashboard_updates_live_and_compacts_in_place(
    start_server: Callable[..., Any], new_page: Callable[..., Any], make_user: Callable[..., Any], settings: Any
) -> None:
    from sessions_app import log, services
    from sessions_app.models import AgentProfile, Event

    settings.TERRET_WORKER = "manual"  # this process appends; the server only serves
    profile = AgentProfile.objects.create(name="live", roles={"main": "demo/offline", "compactor": "demo/offline"})
    alice = make_user("alice")
    session = services.create_session(alice, profile)
    server = start_server(TERRET_WORKER="manual")
    page = new_page(server, alice)
    page.goto("/dashboard/")
    expect(page.locator("#dashboard-body")).to_contain_text("Untitled session")
    page.wait_for_timeout(1000)  # let the socket connect

    for kind, data in [
        ("turn/start", {}),
        ("user/message", {"text": "hello"}),
        ("step/end", {"step": 1, "usage": {"prompt_tokens": 10, "completion_tokens": 2, "cost": None}}),
        ("turn/end", {"status": "completed"}),
        ("session/titled", {"title": "Live title"}),
    ]:
        log.append(session.id, kind, data)

    row = page.locator("#dashboard-body tr", has_text="Live title")
    expect(row).to_be_visible(timeout=10_000)  # the hint, not the 30 s poll
    expect(row).to_contain_text("unpriced")
    assert page.js_errors == []

    row.get_by_role("button", name="Compact Live title").click()
    expect(page.locator("#dashboard-status")).to_contain_text("Compacted: events up to #", timeout=15_000)
    page.wait_for_timeout(1500)  # the compaction's own hint refetches the body; the outcome stays
    expect(page.locator("#dashboard-status")).to_contain_text("Compacted: events up to #")
    assert Event.objects.filter(session=session, kind="session/compacted").count() == 1
