"""Edit-and-resend and regenerate in a real browser: daphne with its
in-process worker, the model a local OpenAI-compatible server (FakeLLM). The
fork opens in place with a breadcrumb back; the parent shows "forked here →"
markers after the events it was forked from, and is otherwise unchanged."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

CHAT = re.compile(r"/sessions/([0-9a-f-]{36})/$")


def main_requests(fake: Any) -> list[dict[str, Any]]:
    return [r for r in fake.requests if r["model"] == "test/model"]


def send(page: Any, text: str, turns: int) -> None:
    box = page.get_by_label("Message")
    box.fill(text)
    box.press("Enter")
    expect(page.locator("#log .k-turn-end")).to_have_count(turns, timeout=30_000)


def session_of(page: Any) -> str:
    match = CHAT.search(page.url)
    assert match, page.url
    return match.group(1)


def test_edit_and_resend_then_regenerate(
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    fake_llm: Any,
) -> None:
    from sessions_app import services
    from sessions_app.log.projection import derive_messages
    from sessions_app.models import AgentProfile, Event
    from tests.helpers import kinds

    counter = itertools.count(1)
    fake_llm.responder = lambda body: (
        Reply(text="A title") if body["model"] == "test/titler" else Reply(text=f"answer {next(counter)}")
    )
    profile = AgentProfile.objects.create(
        name="forkable", roles={"main": "test/model", "titler": "test/titler"}, builtin_tools=[], allow_floor=[]
    )
    alice = make_user("alice")
    parent = services.create_session(alice, profile)
    server = start_server(TERRET_WORKER="inprocess")
    page = new_page(server, alice)
    page.goto(f"/sessions/{parent.id}/")
    expect(page.locator("#live")).to_have_text("live")
    send(page, "first question", 1)
    send(page, "second question", 2)
    expect(page.locator("#log .k-assistant-message .text").last).to_have_text("answer 2")
    parent_head = Event.objects.filter(session=parent).count()

    # Edit and resend the second question: the fork opens in place and answers the edit.
    second = page.locator('#log li[data-kind="user/message"]').nth(1)
    second_seq = int(second.get_attribute("data-seq"))
    second.get_by_role("button", name="Edit and resend").click()
    editor = second.get_by_label(re.compile("Edited message"))
    expect(editor).to_have_value("second question")  # the text as sent, from the API
    editor.fill("second question, edited")
    second.get_by_role("button", name="Send in a fork").click()
    expect(page).not_to_have_url(re.compile(str(parent.id)))
    edited = session_of(page)
    expect(page.locator("#fork-crumb")).to_contain_text("Forked from")
    expect(page.locator("#fork-crumb")).to_contain_text(f"at #{second_seq - 1}")
    expect(page.locator("#log .k-turn-end")).to_have_count(1, timeout=30_000)
    expect(page.locator("#log .k-assistant-message .text").last).to_have_text("answer 3")
    # the model was asked once more, with the history before the question and the edit
    asked = main_requests(fake_llm)[-1]["messages"][1:]
    assert asked == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "second question, edited"},
    ]
    assert len(main_requests(fake_llm)) == 3
    assert Event.objects.get(session_id=edited, seq=1).data["at_seq"] == second_seq - 1
    # Branches in place (issue 34): the fork is branch 2 of 2 at that message, and ‹ goes back.
    switch = page.locator("li.branch-switch")
    expect(switch).to_have_count(1)
    expect(switch.locator(".branch-count")).to_have_text("2/2")
    expect(switch.locator("a.branch-prev")).to_have_attribute("href", f"/sessions/{parent.id}/#ev-{second_seq - 1}")

    # The breadcrumb goes back; the parent shows the marker after the event it forked from.
    page.locator("#fork-parent-link").click()
    expect(page).to_have_url(re.compile(f"/sessions/{parent.id}/"))
    mark = page.locator(f"#ev-{second_seq - 1} + li.fork-mark")
    expect(mark).to_contain_text("forked here →")
    expect(mark.locator("a")).to_have_attribute("href", f"/sessions/{edited}/")

    # Regenerate the first answer: a fork whose model sees exactly what it saw then.
    first_reply = page.locator('#log li[data-kind="assistant/message"]').first
    reply_seq = int(first_reply.get_attribute("data-seq"))
    first_reply.get_by_role("button", name="Regenerate").click()
    expect(page).not_to_have_url(re.compile(str(parent.id)))
    regenerated = session_of(page)
    assert regenerated != edited
    expect(page.locator("#log .k-turn-end")).to_have_count(1, timeout=30_000)
    expect(page.locator("#log .k-assistant-message .text").last).to_have_text("answer 4")
    assert len(main_requests(fake_llm)) == 4
    assert main_requests(fake_llm)[-1]["messages"][1:] == [{"role": "user", "content": "first question"}]
    assert main_requests(fake_llm)[0]["messages"][1:] == [{"role": "user", "content": "first question"}]
    assert derive_messages(regenerated)[-1] == {"role": "assistant", "content": "answer 4"}
    assert Event.objects.get(session_id=regenerated, seq=1).data["at_seq"] < reply_seq

    # The parent is unchanged but for one session/forked_to per fork.
    assert kinds(parent, parent_head) == ["session/forked_to", "session/forked_to"]
    assert [m["content"] for m in derive_messages(parent.id)] == [
        "first question",
        "answer 1",
        "second question",
        "answer 2",
    ]
    page.goto(f"/sessions/{parent.id}/")
    expect(page.locator("li.fork-mark")).to_have_count(2)
    # Each message forked from has its switcher, 1 of 2, › to the fork; the fork's own link
    # ("forked here →") still opens it as a separate session.
    switches = page.locator("li.branch-switch")
    expect(switches).to_have_count(2)
    expect(switches.locator(".branch-count")).to_have_text(["1/2", "1/2"])
    later = page.locator(f"#branch-switch-{second_seq - 1}")
    expect(later.locator("a.branch-next")).to_have_attribute("href", f"/sessions/{edited}/")
    later.locator("a.branch-next").click()
    expect(page).to_have_url(re.compile(f"/sessions/{edited}/"))
    expect(page.locator("li.branch-switch .branch-count")).to_have_text("2/2")
    assert page.js_errors == []
