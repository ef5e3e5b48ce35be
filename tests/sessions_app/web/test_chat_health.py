"""The chat page and turn health: Stop in the composer while a turn is open
(keyed on #chat-facts' data-status), a blocked session's reason, attempts and
Retry button (a new view, permission-checked like cancel), a session waiting
for an agent slot, a partial (stopped) reply, a failed turn's error, and the
live header over the page's socket."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from sessions_app import log
from sessions_app.actions.words import STATUS_LABELS
from sessions_app.log.reads import event_frames
from sessions_app.models import Session
from sessions_app.web.present import META_KINDS, ChatFollower
from tests.helpers import client_for, kinds
from tests.sessions_app.apiutil import block_turn, make_reviewer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


def page(c: Client, session: Session) -> str:
    r = c.get(reverse("sessions:chat", args=[session.id]))
    assert r.status_code == 200
    return r.content.decode()


def facts(html: str) -> str:
    start = html.index('<div id="chat-facts"')
    return html[start : html.index("</div>", start)]


def test_labels_and_meta_kinds_cover_the_new_statuses_and_kinds() -> None:
    assert STATUS_LABELS["blocked"] == "blocked"
    assert "agent/waiting" in META_KINDS
    for kind in ("turn/stalled", "turn/blocked", "turn/retry_requested"):
        assert kind not in META_KINDS  # shown: the person chatting wants to know


def test_an_idle_session_shows_send_and_a_stop_button_hidden_by_its_status(chat: Session) -> None:
    html = page(client_for(chat.owner), chat)
    assert 'data-status="idle"' in facts(html)
    assert 'id="stop-button"' in html and 'form="stop-form"' in html
    stop_form = re.search(r'<form id="stop-form"[^>]*>', html)
    assert stop_form is not None
    assert f'action="{reverse("sessions:cancel", args=[chat.id])}"' in stop_form.group(0)
    assert 'name="csrfmiddlewaretoken"' in html[stop_form.start() : html.index("</form>", stop_form.start())]
    assert "retry-button" not in html


def test_a_running_turn_marks_the_header_for_stop(chat: Session) -> None:
    log.append(chat.id, "turn/start", {})
    assert 'data-status="running"' in facts(page(client_for(chat.owner), chat))


def test_a_blocked_session_shows_why_with_a_retry_button(chat: Session) -> None:
    block_turn(chat.id, reason="the model provider failed 3 times: 503", attempts=3)
    html = page(client_for(chat.owner), chat)
    header = facts(html)
    assert 'data-status="blocked"' in header
    assert 'class="badge blocked"' in header and ">blocked<" in header
    assert "after 3 attempts: the model provider failed 3 times: 503" in header
    assert 'id="retry-button"' in html
    assert f'action="{reverse("sessions:retry", args=[chat.id])}"' in html
    assert "Blocked after 3 attempts: the model provider failed 3 times: 503" in html  # the event's row


def test_a_reviewer_sees_the_block_but_no_retry_or_stop(chat: Session, make_user: Any) -> None:
    block_turn(chat.id)
    html = page(client_for(make_reviewer(make_user("rita"))), chat)
    assert 'data-status="blocked"' in html
    assert "retry-button" not in html and "stop-button" not in html


def test_a_session_waiting_for_an_agent_slot_says_so(chat: Session) -> None:
    log.append(chat.id, "agent/waiting", {"reason": "the registry is full: 2 live agents, all busy", "live": 2})
    header = facts(page(client_for(chat.owner), chat))
    assert "waiting for an agent slot: the registry is full: 2 live agents, all busy" in header


def test_a_partial_reply_is_marked_stopped_and_a_failed_turn_shows_its_error(chat: Session) -> None:
    log.append(chat.id, "turn/start", {})
    log.append(chat.id, "user/message", {"text": "tell me a story"})
    msg = log.append(chat.id, "assistant/message", {"content": "Once upon a", "partial": True})
    end = log.append(chat.id, "turn/end", {"status": "cancelled", "by": "owner"})
    log.append(chat.id, "turn/start", {})
    failed = log.append(chat.id, "turn/end", {"status": "failed", "error": "provider said: 401 invalid key"})
    html = page(client_for(chat.owner), chat)
    row = html[html.index(f'<li id="ev-{msg.seq}"') :]
    row = row[: row.index("</li>")]
    assert "partial" in re.search(r'class="([^"]*)"', row).group(1).split()
    assert 'class="mark stopped"' in row and ">stopped<" in row and "Once upon a" in row
    assert f'<li id="ev-{end.seq}"' in html and "Turn cancelled by owner" in html
    assert f'<li id="ev-{failed.seq}"' in html and "Turn failed: provider said: 401 invalid key" in html


def test_stalls_and_retries_are_shown(chat: Session) -> None:
    log.append(chat.id, "turn/start", {})
    log.append(chat.id, "turn/stalled", {"attempt": 2, "error": "503 upstream", "retry_in": 4.0})
    log.append(chat.id, "turn/stalled", {"since": "2026-12-05T07:00:00+00:00", "phase": "model"})
    log.append(chat.id, "turn/blocked", {"reason": "503 upstream", "attempts": 3})
    log.append(chat.id, "turn/retry_requested", {"by": "owner"})
    html = page(client_for(chat.owner), chat)
    assert "Attempt 2 failed: 503 upstream · retrying in 4 s" in html
    assert "No progress since 2026-12-05T07:00:00+00:00 (phase: model)" in html
    assert "Retry requested by owner" in html
    assert 'data-status="running"' in facts(html)  # the retry cleared the block


def test_a_context_overflow_says_what_does_not_fit(chat: Session) -> None:
    log.append(chat.id, "turn/start", {})
    reason = "the request does not fit test/model's context window even after compaction: HTTP 400"
    log.append(chat.id, "turn/blocked", {"reason": reason, "attempts": 1, "code": "context_overflow"})
    shown = facts(page(client_for(chat.owner), chat))
    assert 'data-status="blocked"' in shown and 'id="retry-button"' in shown
    assert "the request does not fit the model's context window: the request does not fit test/model" in shown
    assert "after 1 attempt" not in shown


def test_a_missing_definition_says_what_is_missing(chat: Session) -> None:
    log.append(chat.id, "turn/start", {})
    reason = "MCP server 'fx' no longer lists 'mcp.fx.mutate', which a call is owed to"
    blocked = {"reason": reason, "attempts": 1, "code": "definition_missing", "what": "tool:mcp.fx.mutate"}
    log.append(chat.id, "turn/blocked", blocked)
    shown = facts(page(client_for(chat.owner), chat))
    assert 'data-status="blocked"' in shown and 'id="retry-button"' in shown
    assert "missing tool:mcp.fx.mutate: MCP server &#x27;fx&#x27; no longer lists" in shown


# ------------------------------------------------------------------ the retry view


def test_retry_view_drives_a_blocked_turn_again(chat: Session) -> None:
    block_turn(chat.id)
    c = client_for(chat.owner)
    r = c.post(reverse("sessions:retry", args=[chat.id]))
    assert r.status_code == 302 and r["Location"] == reverse("sessions:chat", args=[chat.id])
    assert kinds(chat)[-1] == "turn/retry_requested"
    chat.refresh_from_db()
    assert chat.status == "running"


def test_retry_view_with_htmx(chat: Session) -> None:
    block_turn(chat.id)
    c = client_for(chat.owner)
    url = reverse("sessions:retry", args=[chat.id])
    assert c.post(url, headers={"HX-Request": "true"}).status_code == 204
    before = kinds(chat)
    r = c.post(url, headers={"HX-Request": "true"})  # not blocked any more
    assert r.status_code == 409 and b"not blocked" in r.content
    assert kinds(chat) == before


def test_retry_view_is_permission_checked_like_cancel(chat: Session, make_user: Any) -> None:
    block_turn(chat.id)
    url = reverse("sessions:retry", args=[chat.id])
    before = kinds(chat)
    anonymous = Client().post(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))
    assert client_for(make_user("mallory")).post(url).status_code == 404
    assert client_for(make_reviewer(make_user("rita"))).post(url).status_code == 403
    assert client_for(chat.owner, enforce_csrf_checks=True).post(url).status_code == 403
    assert client_for(chat.owner).get(url).status_code == 405
    assert kinds(chat) == before
    assert client_for(make_user("boss", is_staff=True)).post(url).status_code == 302
    assert kinds(chat)[-1] == "turn/retry_requested"


def test_stop_posts_the_cancel_and_a_turn_no_worker_holds_ends_at_once(chat: Session) -> None:
    block_turn(chat.id)
    c = client_for(chat.owner)
    r = c.post(reverse("sessions:cancel", args=[chat.id]), headers={"HX-Request": "true"})
    assert r.status_code == 204
    assert kinds(chat)[-2:] == ["turn/cancel_requested", "turn/end"]


# ------------------------------------------------------------------ the live header


def test_the_live_header_follows_blocked_and_retry(chat: Session) -> None:
    follower = ChatFollower(chat.id, chat.owner)
    seq = block_turn(chat.id, reason="503 upstream", attempts=5)
    html = "".join(f.html for f in follower.events(_frames(chat, seq - 2)))
    assert 'data-status="blocked"' in html and "after 5 attempts: 503 upstream" in html
    assert 'id="retry-button"' in html
    retried = log.append(chat.id, "turn/retry_requested", {"by": "owner"})
    html = "".join(f.html for f in follower.events(_frames(chat, retried.seq - 1)))
    assert 'data-status="running"' in html and "retry-button" not in html


def _frames(session: Session, after: int) -> list[tuple[int, str]]:
    return event_frames(session.id, after)
