"""A profile made in the admin with two ticked tools can call them (issue 34,
part 5): an operator fills the add form in Chromium (checkboxes from the
registry, the model field, the allow floor left empty), then a user's turn
against the fake provider calls both tools; the executions are counted at
their targets (debug.charge's charges.log, clock.now's result) and the model
requests at the fake server. At 1280 and 375 px."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.parametrize("width", [1280, 375])
def test_a_profile_made_in_the_admin_calls_its_two_ticked_tools(
    width: int,
    fake_llm: Any,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    settings: Any,
    tmp_path: Path,
) -> None:
    from sessions_app.models import AgentProfile, Event
    from sessions_app.tools.builtins import CHARGES_FILE, workspace_dir

    settings.TERRET_WORKSPACE_ROOT = tmp_path / "workspaces"  # where the server's in-process worker writes
    server = start_server(TERRET_WORKER="inprocess")
    root = make_user("root", is_staff=True, is_superuser=True)
    alice = make_user("alice")

    page = new_page(server, root, width=width)
    page.goto("/admin/sessions_app/agentprofile/add/")
    page.get_by_label("Name:").fill("two-tools")
    for tool, shown in (
        ("debug.charge", "approval: never · replay: never"),
        ("clock.now", "approval: never · replay: safe"),
    ):
        box = page.locator(f'input[name="builtin_tools"][value="{tool}"]')
        expect(page.locator("label", has=box)).to_contain_text(f"{tool} · {shown}")
        box.check()
    expect(page.locator("#id_main_model_helptext")).to_contain_text("API key set")
    page.get_by_label("Model (main role):").fill("fake/model")
    expect(page.locator("#id_allow_floor")).to_have_value("[]")  # left empty: it becomes the ticked tools
    expect(page.locator("#id_allow_floor_helptext")).to_contain_text("Example")
    page.screenshot(path=str(tmp_path / f"admin-profile-{width}.png"), full_page=True)
    page.locator(".field-builtin_tools").screenshot(path=str(tmp_path / f"admin-tools-{width}.png"))
    page.locator(".field-main_model").screenshot(path=str(tmp_path / f"admin-model-{width}.png"))
    page.locator('input[name="_save"]').click()
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    profile = AgentProfile.objects.get(name="two-tools")
    assert sorted(profile.builtin_tools) == ["clock.now", "debug.charge"]
    assert sorted(profile.allow_floor) == ["clock.now", "debug.charge"]
    assert profile.roles == {"main": "fake/model"}

    fake_llm.script(Reply(tool_calls=[("debug.charge", {}), ("clock.now", {})]), Reply(text="both done"))
    chat = new_page(server, alice, width=width)
    chat.goto("/sessions/new/")
    chat.locator('input[name="profile"][value="two-tools"]').check()
    chat.get_by_role("button", name="Start session").click()
    chat.get_by_label("Message").fill("use both tools")
    chat.get_by_role("button", name="Send", exact=True).click()
    expect(chat.locator("#log .k-turn-end")).to_have_count(1, timeout=30_000)
    expect(chat.locator("#log")).to_contain_text("both done")
    session_id = uuid.UUID(chat.url.rstrip("/").split("/")[-1])

    results = Event.objects.filter(session_id=session_id, kind="tool/result").order_by("seq")
    assert sorted(r.data["name"] for r in results) == ["clock.now", "debug.charge"]
    assert not any(r.data.get("is_error") for r in results), [r.data for r in results]
    assert not Event.objects.filter(session_id=session_id, kind="policy/vetoed").exists()
    lines = (workspace_dir(session_id) / CHARGES_FILE).read_text().splitlines()
    assert len(lines) == 1, "debug.charge ran exactly once"
    assert len(fake_llm.requests) == 2  # the call, then the reply to both results
    assert chat.js_errors == [] and page.js_errors == []
