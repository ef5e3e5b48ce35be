"""LangGraph's own chat UI, agent-chat-ui (its production build, pinned in
app/), driven in Debian's Chromium against a live Terret: daphne serving
/lg/, a real Celery worker running the offline demo model (which streams its
replies word by word and asks for approval on `write <path>: <text>`), on
PostgreSQL and Redis.

Every step is checked in the DOM, and from the first keystroke to the end a
MutationObserver records the message list after every change, so an item
shown twice even for a moment while streaming (F4) fails the test.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.timeout(300),
]

DEMO = "(offline demo model)"

# The message list's items in order, ["h" | "a", text], after every change.
RECORDER = """
(() => {
  window.__snaps = [];
  const take = () => {
    const list = document.querySelector("div.max-w-3xl.mx-auto.flex.flex-col.gap-4");
    if (!list) return;
    const items = [...list.children]
      .filter((el) => el.classList.contains("group"))
      .map((el) => [el.classList.contains("ml-auto") ? "h" : "a", el.innerText.trim()])
      .filter(([, text]) => text);
    const key = JSON.stringify(items);
    const snaps = window.__snaps;
    if (!snaps.length || snaps[snaps.length - 1] !== key) snaps.push(key);
  };
  new MutationObserver(take).observe(document, { subtree: true, childList: true, characterData: true });
})();
"""


def assert_each_once(page: Any) -> int:
    """Every recorded state of the list: no human message twice, no reply
    twice (nor one reply's text inside another's, as a resent whole reply
    concatenated to its streamed deltas would be). Returns how many states."""
    snaps = [json.loads(s) for s in page.evaluate("window.__snaps")]
    for state in snaps:
        humans = [t for k, t in state if k == "h"]
        assert len(humans) == len(set(humans)), f"a human message shown twice: {humans}"
        replies = [t for k, t in state if k == "a"]
        for n, text in enumerate(replies):
            assert text.count(DEMO) <= 1, f"a reply's text twice in one item: {text!r}"
            for other in replies[n + 1 :]:
                assert not (text.startswith(other) or other.startswith(text)), f"an item twice: {text!r}"
    return len(snaps)


def saw_streaming(page: Any) -> bool:
    """Whether the recorder saw a text reply while it was incomplete (the
    demo model's answer to "hello ..." ends with "You said: ..."), so the
    checks of assert_each_once ran mid-stream."""
    for raw in page.evaluate("window.__snaps"):
        for kind, text in json.loads(raw):
            if kind == "a" and text.startswith(DEMO + " I am") and "You said:" not in text:
                return True
    return False


def send(page: Any, text: str) -> None:
    """Type and send, once the UI is idle (while it streams, Send is Cancel)."""
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    box = page.get_by_placeholder("Type your message...")
    box.fill(text)
    page.get_by_role("button", name="Send").click()
    expect(box).to_have_value("")


def wait_idle(thread_id: str, timeout: float = 30.0) -> None:
    from sessions_app.models import Session

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = Session.objects.get(id=thread_id)
        if s.open_turn_seq is None:
            return
        time.sleep(0.1)
    raise AssertionError(f"thread {thread_id} still running")


def send_to_interrupt(page: Any, text: str) -> None:
    """Send `text` (which parks), and wait until the UI has settled on the
    interrupt: after the run's stream ends, useStream re-reads the history and
    the approval card resets its choice for the interrupt it then holds, so a
    choice made before that is lost (upstream's behaviour, not the door's)."""
    with page.expect_response(lambda r: r.url.endswith("/history") and r.request.method == "POST"):
        send(page, text)
    expect(page.get_by_text("Edit/Approve")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    page.wait_for_timeout(300)  # the card's effect runs in the render after that answer


def streaming_reply(thread_id: str, timeout: float = 20.0) -> bool:
    """Wait until the thread's open turn is in its model call, streaming."""
    from sessions_app.models import Event, Session

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        turn = Session.objects.get(id=thread_id).open_turn_seq
        if turn is not None and Event.objects.filter(session_id=thread_id, seq__gt=turn, kind="step/start").exists():
            time.sleep(0.5)
            return Session.objects.get(id=thread_id).open_turn_seq == turn
        time.sleep(0.05)
    return False


def thread_of(page: Any) -> str:
    found = re.search(r"threadId=([0-9a-f-]{36})", page.url)
    assert found, page.url
    return found[1]


def reply_to(text: str) -> str:
    return f"You said: {text}"


def test_agent_chat_ui_against_terret(
    start_worker: Callable[..., Any],
    start_server: Callable[..., Any],
    browser: Any,
    chat_ui: Any,
    make_user: Callable[..., Any],
    demo_profile: Any,
    settings: Any,
    tmp_path: Any,
) -> None:
    from sessions_app.models import Event, Session
    from tests.helpers import document_text
    from tests.sessions_app.apiutil import make_reviewer, token_for

    workspaces = tmp_path / "workspaces"
    start_worker(TERRET_DEMO_DELAY="0.03", TERRET_WORKSPACE_ROOT=str(workspaces))
    server = start_server(TERRET_LG_CORS_ORIGINS=chat_ui.url, TERRET_WORKSPACE_ROOT=str(workspaces))
    alice = make_reviewer(make_user("alice"))  # the owner decides her own approvals
    token = token_for(alice)
    ctx = browser.new_context(base_url=chat_ui.url, viewport={"width": 1400, "height": 1000})
    ctx.set_default_timeout(30_000)
    ctx.add_init_script(f"window.localStorage.setItem('lg:chat:apiKey', {token!r});")
    ctx.add_init_script(RECORDER)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    refused: list[str] = []
    page.on(
        "response", lambda r: refused.append(f"{r.status} {r.url}") if "/lg/" in r.url and r.status >= 400 else None
    )
    home = f"/?apiUrl={server.url}/lg&assistantId=demo&chatHistoryOpen=true"  # the thread history shown
    page.goto(home)
    replies = page.locator("div.group.mr-auto")
    humans = page.locator("div.group.ml-auto p.rounded-3xl")

    # 1. A thread of three messages: one thread, each message once (F1, F6).
    for n, word in enumerate(["one", "two", "three"], start=1):
        send(page, f"hello {word}")
        expect(replies.nth(n - 1)).to_contain_text(reply_to(f"hello {word}"))
        expect(humans).to_have_count(n)
        expect(replies).to_have_count(n)
    assert assert_each_once(page) > 20 and saw_streaming(page)
    first = thread_of(page)
    assert Session.objects.filter(owner=alice).count() == 1, "a second message forked the thread"
    assert Session.objects.get(id=first).profile.name == "demo"
    wait_idle(first)

    # 2. Approvals: approved, edited, rejected; then typing at an interrupt (F2, F3, F5).
    send_to_interrupt(page, "write a.txt: alpha")  # the HITL card, not raw JSON: action_requests carry args
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(replies.last).to_contain_text("workspace.write returned")
    wait_idle(first)

    send_to_interrupt(page, "write b.txt: beta")
    field = next(t for t in page.locator("textarea").all() if t.input_value() == "beta")
    field.fill("beta, edited")
    page.get_by_role("button", name="Submit", exact=True).click()
    expect(replies.last).to_contain_text("workspace.write returned")
    wait_idle(first)

    send_to_interrupt(page, "write c.txt: gamma")
    page.get_by_placeholder("Share feedback with the agent...").fill("not this one")
    page.get_by_role("button", name="Submit rejection").click()
    expect(replies.last).to_contain_text("did not run")
    wait_idle(first)

    send_to_interrupt(page, "write d.txt: delta")
    send(page, "hello instead")
    expect(replies.last).to_contain_text(reply_to("hello instead"))
    wait_idle(first)

    expect(humans).to_have_count(8)
    expect(page.get_by_role("heading", name=re.compile("^Tool Result:"))).to_have_count(4)  # a, b, c, d: once each
    # The agent's files are the session's documents (kept in its journal, not on a disk).
    assert document_text(first, "a.txt") == "alpha"
    assert document_text(first, "b.txt") == "beta, edited"
    assert document_text(first, "c.txt") is None and document_text(first, "d.txt") is None
    assert Session.objects.filter(owner=alice).count() == 1
    assert assert_each_once(page) > 20
    assert saw_streaming(page)

    # 3. Reload mid-run: the page comes back with the thread, each item once.
    send(page, "hello again, " + "and again " * 80)
    assert streaming_reply(first), "the reload comes while the reply streams"
    page.reload()
    expect(humans.last).to_contain_text("hello again")
    wait_idle(first)
    page.reload()
    expect(replies.last).to_contain_text("You said: hello again")
    assert_each_once(page)

    # 4. History and switching threads.
    page.get_by_role("button", name="New thread").first.click()
    send(page, "hello second thread")
    expect(replies.last).to_contain_text(reply_to("hello second thread"))
    second = thread_of(page)
    assert second != first
    wait_idle(second)
    history = page.locator("button p.truncate")
    expect(history.filter(has_text="hello one")).to_have_count(1)
    expect(history.filter(has_text="hello second thread")).to_have_count(1)
    history.filter(has_text="hello one").click()
    expect(humans.first).to_have_text("hello one")
    expect(humans.filter(has_text="hello instead")).to_have_count(1)
    history.filter(has_text="hello second thread").click()
    expect(humans).to_have_count(1)
    expect(replies).to_have_count(1)
    assert_each_once(page)

    # 5. Regenerate the second thread's reply: a fork, streamed once (F7).
    replies.last.hover()
    replies.last.get_by_role("button", name="Refresh").click()
    forks = Session.objects.filter(owner=alice).exclude(id__in=[first, second])
    deadline = time.monotonic() + 30
    while not forks.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    fork = forks.get()
    while not Event.objects.filter(session_id=fork.id, kind="turn/end").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    start = Event.objects.filter(session_id=fork.id, kind="turn/start").order_by("-seq").first()
    assert start is not None and start.data.get("regenerate") is True
    regenerated = Event.objects.filter(session_id=fork.id, kind="assistant/message", seq__gt=start.seq).get()
    assert reply_to("hello second thread") in regenerated.data["content"]
    expect(replies.last).to_contain_text(reply_to("hello second thread"))
    assert_each_once(page)
    assert saw_streaming(page)
    assert not errors, errors
    assert not refused, refused
