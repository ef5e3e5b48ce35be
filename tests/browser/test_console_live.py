"""The operators' console as a live fleet view, in Chromium at 1280 and
375 px (issue 34, part 6): the page is open before anything happens; a
user's turn parks on an approval and the request appears on /ops/ over the
socket; the operator approves it in place (no reload); the row goes, the
turn runs the call and ends, and the operators' log names the actor. Then
the session's timeline: a row opens to its JSON."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from tests.helpers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.parametrize("width", [1280, 375])
def test_an_approval_is_decided_on_ops_without_a_reload(
    width: int,
    start_worker: Callable[..., Any],
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
    tmp_path: Path,
) -> None:
    from sessions_app import services
    from sessions_app.models import Event, OperatorAction

    start_worker(TERRET_DEMO_DELAY="0.01")
    server = start_server()
    alice = make_user("alice")
    opsy = make_user("opsy", is_staff=True)
    opsy.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    session = services.create_session(alice, demo_profile)

    ops = new_page(server, opsy, width=width)
    ops.goto("/ops/")
    expect(ops.locator("#live")).to_have_text("live")
    ops.evaluate("window.__sameDocument = true")
    expect(ops.locator("details#ops-approvals")).to_have_count(1)  # empty: collapsed to one line
    assert ops.evaluate("document.documentElement.scrollWidth") <= width, "the page overflows"

    chat = new_page(server, alice, width=width)
    chat.goto(f"/sessions/{session.id}/")
    chat.get_by_label("Message").fill("write notes.txt: decided on the console")
    chat.get_by_role("button", name="Send", exact=True).click()
    expect(chat.locator("#status")).to_have_text("waiting for approval", timeout=30_000)

    # The request arrives on /ops/ over the socket: a full card now, with the buttons.
    row = ops.locator(f'section#ops-approvals li[data-session="{session.id}"]')
    expect(row).to_be_visible(timeout=20_000)
    expect(row).to_contain_text("workspace.write")
    ops.screenshot(path=str(tmp_path / f"ops-approval-{width}.png"), full_page=True)
    assert ops.evaluate("document.documentElement.scrollWidth") <= width, "the page overflows"
    row.get_by_label("Reason").fill("looks fine")
    row.get_by_role("button", name="Approve").click()

    expect(ops.locator("#ops-status")).to_contain_text("Approved", timeout=20_000)
    expect(ops.locator(f'#ops-approvals li[data-session="{session.id}"]')).to_have_count(0)
    expect(chat.locator("#log .k-turn-end")).to_have_count(1, timeout=30_000)
    assert ops.evaluate("window.__sameDocument") is True  # decided in place: no reload
    expect(ops.locator("#ops-recent")).to_contain_text("approve")

    resolved = Event.objects.get(session=session, kind="approval/resolved")
    assert resolved.data["verdict"] == "approve" and resolved.data.get("by") == "opsy", resolved.data
    wait_for(lambda: Event.objects.filter(session=session, kind="tool/result").exists(), what="the write ran")
    assert list(OperatorAction.objects.values_list("actor", "action", "target")) == [
        ("opsy", "approve", str(session.id))
    ]
    ops.screenshot(path=str(tmp_path / f"ops-after-{width}.png"), full_page=True)

    # The session's timeline: one line per event, each opening to its JSON.
    ops.goto(f"/ops/sessions/{session.id}/timeline/")
    verdict = ops.locator('#timeline li[data-kind="approval/resolved"]')
    expect(verdict.locator("summary")).to_contain_text("approve opsy")
    expect(verdict.locator("pre")).to_be_hidden()
    verdict.locator("summary").click()
    expect(verdict.locator("pre")).to_contain_text('"verdict": "approve"')
    shown = [int(seq) for seq in ops.eval_on_selector_all("#timeline > li", "els => els.map(e => e.dataset.seq)")]
    assert shown == list(range(1, len(shown) + 1)), "every event once, in order"  # the titler may add more later
    assert ops.evaluate("document.documentElement.scrollWidth") <= width, "the timeline overflows"
    ops.screenshot(path=str(tmp_path / f"ops-timeline-{width}.png"), full_page=True)
    assert ops.js_errors == [] and chat.js_errors == []
