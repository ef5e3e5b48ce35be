"""The session pages: permissions, CSRF, bad input, paging, and what each page shows."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from sessions_app import log, services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.web.sessions import PAGE_SIZE
from tests.helpers import client_for, kinds

pytestmark = pytest.mark.django_db


@pytest.fixture
def profile(db: Any) -> AgentProfile:
    # A transactional test elsewhere may have flushed the migration's row.
    prof, _ = AgentProfile.objects.get_or_create(
        name="demo",
        defaults={"builtin_tools": ["clock.now"], "allow_floor": ["clock.*"], "description": "demo profile"},
    )
    return prof


def classes_of(page: str, seq: int) -> set[str]:
    m = re.search(rf'<li id="ev-{seq}"[^>]*? class="([^"]*)"', page)
    assert m is not None, f"no element for event {seq}"
    return set(m.group(1).split())


def urls(session: Session) -> dict[str, str]:
    return {
        "chat": reverse("sessions:chat", args=[session.id]),
        "message": reverse("sessions:message", args=[session.id]),
        "cancel": reverse("sessions:cancel", args=[session.id]),
    }


# ------------------------------------------------------------------ permissions


def test_anonymous_is_redirected_to_login(chat: Session) -> None:
    c = Client()
    for url in [reverse("sessions:list"), reverse("sessions:new"), urls(chat)["chat"]]:
        r = c.get(url)
        assert r.status_code == 302 and r["Location"].startswith(reverse("login")), url
    for url in [urls(chat)["message"], urls(chat)["cancel"]]:
        r = c.post(url, {"text": "hi"})
        assert r.status_code == 302 and r["Location"].startswith(reverse("login")), url
    assert kinds(chat) == ["agent/spawned"]


def test_login_page_renders_and_logs_in(owner: Any) -> None:
    c = Client()
    r = c.get(reverse("login"))
    assert r.status_code == 200 and b'name="password"' in r.content
    r = c.post(reverse("login"), {"username": "owner", "password": "pw-owner"})
    assert r.status_code == 302
    assert c.get(reverse("sessions:list")).status_code == 200
    bad = Client().post(reverse("login"), {"username": "owner", "password": "wrong"})
    assert bad.status_code == 200 and b"did not match" in bad.content


def test_other_users_get_404(chat: Session, make_user: Callable[..., Any]) -> None:
    c = client_for(make_user("mallory"))
    u = urls(chat)
    assert c.get(u["chat"]).status_code == 404
    assert c.get(u["chat"] + "?fragment=approvals").status_code == 404
    assert c.post(u["message"], {"text": "hello"}).status_code == 404
    assert c.post(u["cancel"]).status_code == 404
    assert chat.title not in c.get(reverse("sessions:list")).content.decode() or not chat.title
    assert str(chat.id) not in c.get(reverse("sessions:list")).content.decode()
    assert kinds(chat) == ["agent/spawned"]


def test_unknown_session_is_404(owner: Any) -> None:
    c = client_for(owner)
    assert c.get("/sessions/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_staff_see_and_drive_every_session(chat: Session, make_user: Callable[..., Any]) -> None:
    staff = make_user("admin", is_staff=True)
    c = client_for(staff)
    listing = c.get(reverse("sessions:list")).content.decode()
    assert str(chat.id) in listing and ">owner<" in listing  # owner column shown to staff
    assert c.get(urls(chat)["chat"]).status_code == 200
    r = c.post(urls(chat)["message"], {"text": "from staff", "key": "k1"})
    assert r.status_code == 302
    assert "user/message" in kinds(chat)


def test_list_shows_only_own_sessions(chat: Session, profile: AgentProfile, make_user: Callable[..., Any]) -> None:
    other = services.create_session(make_user("bob"), profile)
    listing = client_for(chat.owner).get(reverse("sessions:list")).content.decode()
    assert str(chat.id) in listing
    assert str(other.id) not in listing


def test_reviewer_can_view_but_not_drive(chat: Session, make_user: Callable[..., Any]) -> None:
    reviewer = make_user("rita")
    reviewer.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    c = client_for(reviewer)
    page = c.get(urls(chat)["chat"])
    assert page.status_code == 200
    assert b'id="composer"' not in page.content and b"cancel-button" not in page.content
    assert c.post(urls(chat)["message"], {"text": "steer"}).status_code == 403
    assert c.post(urls(chat)["cancel"]).status_code == 403
    assert kinds(chat) == ["agent/spawned"]


def test_csrf_is_enforced(chat: Session) -> None:
    c = client_for(chat.owner, enforce_csrf_checks=True)
    assert c.post(urls(chat)["message"], {"text": "hi"}).status_code == 403
    assert c.post(urls(chat)["cancel"]).status_code == 403
    assert c.post(reverse("sessions:new"), {"profile": "demo"}).status_code == 403
    assert kinds(chat) == ["agent/spawned"]
    page = c.get(urls(chat)["chat"]).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    r = c.post(urls(chat)["message"], {"text": "hi", "csrfmiddlewaretoken": token.group(1)})
    assert r.status_code == 302
    assert kinds(chat)[-1] == "user/message"


# ------------------------------------------------------------------ new session


def test_new_session_creates_the_session_and_its_agent_waits_for_input(owner: Any, profile: AgentProfile) -> None:
    c = client_for(owner)
    form = c.get(reverse("sessions:new")).content.decode()
    assert 'value="demo"' in form
    r = c.post(reverse("sessions:new"), {"profile": "demo"})
    session = Session.objects.get(owner=owner)
    assert r.status_code == 302 and r["Location"] == reverse("sessions:chat", args=[session.id])
    assert session.profile == profile
    assert kinds(session) == []  # the runtime spawns the agent on the first input
    assert c.get(r["Location"]).status_code == 200  # a session without an agent renders


@pytest.mark.parametrize("data", [{"profile": "no-such-profile"}, {}])
def test_new_session_bad_profile_is_a_clear_error(owner: Any, profile: AgentProfile, data: dict[str, str]) -> None:
    r = client_for(owner).post(reverse("sessions:new"), data)
    assert r.status_code == 400
    body = r.content.decode()
    assert "That agent profile does not exist." in body or "Pick an agent profile." in body
    assert not Session.objects.filter(owner=owner).exists()
    assert not Event.objects.exists()


# ------------------------------------------------------------------ messages


@pytest.mark.parametrize("text", ["", "   \n  "])
def test_empty_message_is_rejected_and_nothing_appended(chat: Session, text: str) -> None:
    c = client_for(chat.owner)
    r = c.post(urls(chat)["message"], {"text": text, "key": "k"})
    assert r.status_code == 400
    assert "Type a message first." in r.content.decode()
    # htmx does not swap a 4xx: it gets the composer with the error, as a 200
    # marked refused, so the error shows where the user typed.
    r = c.post(urls(chat)["message"], {"text": text}, headers={"HX-Request": "true"})
    assert r.status_code == 200 and "Type a message first." in r.content.decode()
    assert r["X-Terret-Error"] == "invalid_input"
    assert b"<html" not in r.content  # the composer partial, not the page
    assert kinds(chat) == ["agent/spawned"]


def test_message_on_idle_agent_starts_a_turn(chat: Session) -> None:
    c = client_for(chat.owner)
    r = c.post(urls(chat)["message"], {"text": "what time is it", "key": "key-1"})
    assert r.status_code == 302 and r["Location"].startswith(urls(chat)["chat"])
    assert kinds(chat) == ["agent/spawned", "turn/start", "user/message"]
    page = c.get(urls(chat)["chat"]).content.decode()
    assert "what time is it" in page
    assert 'class="badge waiting_worker"' in page  # the turn is open, and no worker has taken it yet


def test_resubmitted_form_is_not_run_twice(chat: Session) -> None:
    c = client_for(chat.owner)
    for _ in range(2):
        c.post(urls(chat)["message"], {"text": "once", "key": "same-key"})
    assert kinds(chat).count("user/message") == 1
    assert kinds(chat).count("input/queued") == 0


def test_message_while_running_is_queued_until_it_lands(chat: Session) -> None:
    c = client_for(chat.owner)
    c.post(urls(chat)["message"], {"text": "first", "key": "a"})
    r = c.post(urls(chat)["message"], {"text": "steer me", "key": "b"}, headers={"HX-Request": "true"})
    assert r.status_code == 200
    body = r.content.decode()
    assert "Queued" in body and 'id="composer"' in body and "<html" not in body
    assert 'value="b"' not in body  # a fresh idempotency key for the next message
    queued = Event.objects.get(session=chat, kind="input/queued")
    page = c.get(urls(chat)["chat"]).content.decode()
    assert "queued" in classes_of(page, queued.seq)
    # The step drains it into context/injected: the queued row is then bookkeeping.
    log.append(chat.id, "context/injected", {"text": "steer me", "source_seq": queued.seq})
    page = c.get(urls(chat)["chat"]).content.decode()
    assert "queued" not in classes_of(page, queued.seq)
    assert "meta" in classes_of(page, queued.seq)


def test_cancel(chat: Session) -> None:
    c = client_for(chat.owner)
    r = c.post(urls(chat)["cancel"])
    assert r.status_code == 302
    assert "turn/cancel_requested" not in kinds(chat)  # idle: nothing to cancel
    c.post(urls(chat)["message"], {"text": "go"})
    r = c.post(urls(chat)["cancel"], headers={"HX-Request": "true"})
    assert r.status_code == 204
    # No worker holds the turn yet, so the cancel closes it at once.
    assert kinds(chat)[-2:] == ["turn/cancel_requested", "turn/end"]


# ------------------------------------------------------------------ chat page


def test_chat_page_renders_tool_calls_results_cost_and_live_state(chat: Session) -> None:
    sid = chat.id
    log.append(sid, "turn/start", {})
    log.append(sid, "user/message", {"text": "<b>time</b>"})
    log.append(sid, "step/start", {"step": 1, "model": "demo/offline"})
    call = {"id": "c1", "name": "clock.now", "arguments": '{"tz": "UTC"}'}
    log.append(sid, "assistant/message", {"content": None, "tool_calls": [call]})
    log.append(sid, "tool/result", {"call_id": "c1", "name": "clock.now", "content": "12:00", "is_error": False})
    log.append(sid, "step/end", {"step": 1, "usage": {"prompt_tokens": 3, "completion_tokens": 2, "cost": None}})
    log.append(sid, "session/titled", {"title": "Asking the time"})
    page = client_for(chat.owner).get(urls(chat)["chat"]).content.decode()
    assert "&lt;b&gt;time&lt;/b&gt;" in page  # escaped
    # One card for the call: its arguments and its result together.
    card = re.search(r'<details class="tool-card" id="call-c1" data-call-id="c1">(.*?)</details>', page, re.S)
    assert card is not None
    assert "&quot;tz&quot;: &quot;UTC&quot;" in card.group(1)
    assert "12:00" in card.group(1) and "done" in card.group(1)
    assert "Asking the time" in page
    assert (
        '<span id="cost">$0.0000 + 1 unpriced</span>' in page
    )  # one cost format everywhere (services.usage.format_cost)
    assert "/compact/" in page
    chat.refresh_from_db()
    assert f'ws-connect="/ws/sessions/{chat.id}/page/?after={chat.last_seq}"' in page
    listing = client_for(chat.owner).get(reverse("sessions:list")).content.decode()
    assert (
        "Asking the time" in listing
        and "<td>$0.0000 + 1 unpriced</td>" in listing
        and "waiting for a worker" in listing
    )
    assert chat.agent.agent_id in listing


def test_long_sessions_page_back_through_history(chat: Session) -> None:
    for i in range(PAGE_SIZE + 20):
        log.append(chat.id, "model/updated", {"role": "main", "spec": f"m/{i}"})
    chat.refresh_from_db()
    last = chat.last_seq
    c = client_for(chat.owner)
    page = c.get(urls(chat)["chat"]).content.decode()
    seqs = [int(s) for s in re.findall(r'<li id="ev-(\d+)"', page)]
    assert seqs == list(range(last - PAGE_SIZE + 1, last + 1))
    first = seqs[0]
    assert f"?before={first}" in page
    part = c.get(urls(chat)["chat"] + f"?before={first}", headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in part
    older = [int(s) for s in re.findall(r'<li id="ev-(\d+)"', part)]
    assert older == list(range(1, first))
    assert "Load earlier" not in part  # reached the start
    full = c.get(urls(chat)["chat"] + f"?before={first}").content.decode()  # no-JS: a page of history
    assert "Jump to latest" in full and "ws-connect" not in full
    assert c.get(urls(chat)["chat"] + "?before=abc").status_code == 400
    assert c.get(urls(chat)["chat"] + "?before=0").status_code == 400


def test_approvals_fragment_lists_pending_calls(chat: Session) -> None:
    sid = chat.id
    log.append(sid, "turn/start", {})
    log.append(sid, "approval/requested", {"call_id": "w1", "name": "workspace.write", "args": {"path": "a.txt"}})
    c = client_for(chat.owner)
    page = c.get(urls(chat)["chat"]).content.decode()
    assert "waiting for approval" in page
    frag = c.get(urls(chat)["chat"] + "?fragment=approvals").content.decode()
    assert frag.strip().startswith('<section id="approvals"')
    assert "workspace.write" in frag
    assert c.get(urls(chat)["chat"] + "?fragment=nope").status_code == 400
