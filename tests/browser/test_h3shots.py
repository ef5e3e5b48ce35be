from typing import Any
import pytest
from playwright.sync_api import expect
pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

def test_shots(start_server: Any, new_page: Any, make_user: Any, demo_profile: Any) -> None:
    from sessions_app import services, log
    server = start_server(TERRET_WORKER="inprocess", TERRET_DEMO_DELAY="0.2")
    alice = make_user("alice")
    s = services.create_session(alice, demo_profile)
    for w in (375, 1280):
        page = new_page(server, alice, width=w)
        page.goto(f"/sessions/{s.id}/")
        expect(page.locator("#live")).to_have_text("live")
        if w == 375:
            page.screenshot(path=f"/tmp/h3_empty_{w}.png", full_page=True)
            page.get_by_label("Message").fill("write notes.txt: **hello** there")
            page.get_by_role("button", name="Send", exact=True).click()
            page.wait_for_timeout(3000)
            page.get_by_label("Message").fill("tell me a long story about the sea and wind and more and more words")
            page.wait_for_timeout(500)
        page.screenshot(path=f"/tmp/h3_chat_{w}.png", full_page=True)
    page.goto("/settings/"); page.screenshot(path="/tmp/h3_settings.png", full_page=True)
