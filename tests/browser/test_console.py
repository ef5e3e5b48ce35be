"""The operators' console in a real browser, against daphne: a staff member
signs in, sees a blocked session, abandons it, and suspends a profile with
the form; the page reads at 1280 px and at 375 px (cards stack, nothing
overflows). Screenshots go to the test's tmp dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]


def test_console_abandon_and_suspend(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
    manual_worker: None,
    tmp_path: Path,
) -> None:
    from sessions_app import log, services
    from sessions_app.models import OperatorAction, Session, Suspension

    server = start_server(TERRET_WORKER="manual")
    make_user("opsy", is_staff=True)
    session = services.create_session(make_user("alice"), demo_profile)
    services.run_turn(session.id, "go")
    log.append(session.id, "turn/blocked", {"reason": "x", "attempts": 5})

    page = new_page(server, width=1280)
    page.goto("/ops/")
    expect(page).to_have_url(f"{server.url}/accounts/login/?next=/ops/")
    page.get_by_label("Username").fill("opsy")
    page.get_by_label("Password").fill("pw-opsy")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Operators' console")).to_be_visible()

    row = page.locator(f'#ops-blocked li[data-session="{session.id}"]')
    expect(row).to_be_visible()
    page.screenshot(path=str(tmp_path / "console-1280.png"), full_page=True)
    row.get_by_label("Reason").fill("dead provider")
    row.get_by_role("button", name="Abandon").click()
    expect(page.locator(".messages")).to_contain_text("Abandoned the blocked turn")
    expect(page.locator(f'#ops-blocked li[data-session="{session.id}"]')).to_have_count(0)
    assert Session.objects.get(id=session.id).status == "idle"
    expect(page.locator("#ops-recent")).to_contain_text("abandon")

    page.set_viewport_size({"width": 375, "height": 800})
    form = page.locator(".ops-suspend form")
    form.get_by_label("Scope").select_option("profile")
    form.get_by_label("Target").fill("demo")
    form.get_by_label("Reason").fill("budget review")
    form.get_by_role("button", name="Suspend").click()
    expect(page.locator(".messages")).to_contain_text("Suspended admission: profile demo.")
    expect(page.locator("#ops-suspended")).to_contain_text("profile demo")
    expect(page.locator("#ops-suspended")).to_contain_text("budget review")
    assert Suspension.objects.filter(scope="profile", target="demo", by="opsy").exists()
    assert page.evaluate("document.documentElement.scrollWidth") <= 375, "the page overflows at 375 px"
    # Cards with items stack at full width; an empty one (blocked, once abandoned) collapses to a line.
    expect(page.locator("details#ops-blocked")).to_have_count(1)
    boxes = [page.locator(f"#ops-{k}").bounding_box() for k in ("suspended", "sessions")]
    assert boxes[0] and boxes[1] and boxes[1]["y"] > boxes[0]["y"] and boxes[1]["x"] == boxes[0]["x"], "cards stack"
    page.screenshot(path=str(tmp_path / "console-375.png"), full_page=True)
    assert (tmp_path / "console-1280.png").stat().st_size > 0 and (tmp_path / "console-375.png").stat().st_size > 0
    assert list(OperatorAction.objects.order_by("at").values_list("actor", "action")) == [
        ("opsy", "abandon"),
        ("opsy", "suspend"),
    ]
    assert page.js_errors == []
