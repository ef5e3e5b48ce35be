"""The composer (errors shown, lanes, no silent cut, no-store), tool-call
cards, cost per turn, the context view and model picker, and the error pages."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.urls import reverse

from sessions_app import log, services
from sessions_app.models import Event, Session
from sessions_app.services import MAX_INPUT_CHARS
from tests.helpers import client_for, kinds

pytestmark = pytest.mark.django_db


def chat_url(s: Session) -> str:
    return reverse("sessions:chat", args=[s.id])


def found(pattern: str, text: str, group: int = 0) -> str:
    match = re.search(pattern, text, re.S)
    assert match is not None, pattern
    return match.group(group)


def test_the_chat_page_is_no_store_and_its_box_has_no_maxlength(chat: Session) -> None:
    r = client_for(chat.owner).get(chat_url(chat))
    assert r["Cache-Control"] == "no-store"
    box = found(r"<textarea name=\"text\"[^>]*>", r.content.decode())
    assert "maxlength" not in box and f'data-max-chars="{MAX_INPUT_CHARS}"' in box


def test_an_oversize_message_is_refused_whole_and_kept_in_the_box(chat: Session) -> None:
    text = "x" * (MAX_INPUT_CHARS + 1)
    r = client_for(chat.owner).post(
        reverse("sessions:message", args=[chat.id]), {"text": text, "key": "k1"}, headers={"HX-Request": "true"}
    )
    body = r.content.decode()
    assert r.status_code == 200 and r["X-Terret-Error"] == "invalid_input"
    assert f"Too long: {MAX_INPUT_CHARS + 1:,}".replace(",", "") in body.replace(",", "")
    assert text in body  # nothing cut: the whole text is back in the box
    assert kinds(chat) == ["agent/spawned"]


def test_lanes_while_a_turn_runs(chat: Session) -> None:
    c = client_for(chat.owner)
    url = reverse("sessions:message", args=[chat.id])
    c.post(url, {"text": "first", "key": "a"})
    r = c.post(url, {"text": "steer", "key": "b", "lane": "steer"}, headers={"HX-Request": "true"})
    assert "Queued: your message rides the agent" in r.content.decode()
    r = c.post(url, {"text": "later", "key": "c", "lane": "follow_up"}, headers={"HX-Request": "true"})
    assert "new turn when this one ends" in r.content.decode()
    assert Event.objects.get(session=chat, kind="input/queued").data["text"] == "steer"
    deferred = Event.objects.get(session=chat, kind="input/deferred")
    assert deferred.data["text"] == "later" and deferred.data["lane"] == "follow_up"
    page = c.get(chat_url(chat)).content.decode()
    row = found(rf'<li id="ev-{deferred.seq}"[^>]*class="([^"]*)"', page, 1)
    assert "queued" in row.split() and "sent when this turn ends" in page
    r = c.post(url, {"text": "x", "key": "d", "lane": "sideways"}, headers={"HX-Request": "true"})
    assert r["X-Terret-Error"] == "invalid_input" and "Pick Steer now" in r.content.decode()


def test_one_card_per_call_with_approval_result_and_quiet_rows(chat: Session) -> None:
    sid = chat.id
    log.append(sid, "turn/start", {})
    log.append(sid, "user/message", {"text": "write a.txt: hi"})
    log.append(sid, "step/start", {"step": 1, "model": "demo/offline"})
    call = {"id": "c9", "name": "workspace.write", "arguments": '{"path": "a.txt"}'}
    log.append(sid, "assistant/message", {"content": None, "tool_calls": [call]})
    asked = log.append(
        sid, "approval/requested", {"call_id": "c9", "name": "workspace.write", "args": {"path": "a.txt"}}
    )
    verdict = log.append(
        sid, "approval/resolved", {"call_id": "c9", "verdict": "deny", "by": "rita", "reason": "not now"}
    )
    result = log.append(
        sid, "tool/result", {"call_id": "c9", "name": "workspace.write", "content": "denied: not now", "is_error": True}
    )
    page = client_for(chat.owner).get(chat_url(chat)).content.decode()
    assert page.count('class="tool-card"') == 1
    card = found(r'<details class="tool-card" id="call-c9".*?</details>', page)
    assert "denied" in card and "by rita" in card and "not now" in card and "denied: not now" in card
    for seq in (asked.seq, verdict.seq, result.seq):  # on the card; their rows show with "Show all events"
        assert "meta" in found(rf'<li id="ev-{seq}"[^>]*class="([^"]*)"', page, 1).split()


def test_the_socket_updates_an_earlier_card_in_place(chat: Session) -> None:
    from sessions_app.web.present import ChatFollower

    log.append(chat.id, "turn/start", {})
    log.append(
        chat.id,
        "assistant/message",
        {"content": None, "tool_calls": [{"id": "c1", "name": "clock.now", "arguments": "{}"}]},
    )
    follower = ChatFollower(chat.id, chat.owner)
    ev = log.append(chat.id, "tool/result", {"call_id": "c1", "name": "clock.now", "content": "12:00"})
    import json

    frame = json.dumps({"seq": ev.seq, "kind": "tool/result", "data": ev.data, "at": ev.created_at.isoformat()})
    html = "".join(f.html for f in follower.events([(ev.seq, frame)]))
    assert '<span class="call-state state-done" id="call-c1-state" hx-swap-oob="true">' in html
    assert 'id="call-c1-outcome" hx-swap-oob="true"' in html and "12:00" in html


def test_cost_per_turn_priced_and_unpriced(chat: Session) -> None:
    sid = chat.id
    log.append(sid, "turn/start", {})
    log.append(sid, "step/end", {"step": 1, "usage": {"prompt_tokens": 1000, "completion_tokens": 234, "cost": 0.0125}})
    log.append(sid, "turn/end", {"status": "completed"})
    log.append(sid, "turn/start", {})
    log.append(sid, "step/end", {"step": 1, "usage": {"prompt_tokens": 10, "completion_tokens": 5, "cost": None}})
    log.append(sid, "turn/end", {"status": "completed"})
    page = client_for(chat.owner).get(chat_url(chat)).content.decode()
    costs = re.findall(r'<span class="turn-cost"[^>]*>· (.*?)</span>', page)
    assert costs == ["1 step · 1,234 tokens · $0.0125", "1 step · 15 tokens · $0.0000 + 1 unpriced"]


def test_suggestions_only_on_an_empty_chat(chat: Session) -> None:
    c = client_for(chat.owner)
    assert 'id="suggestions"' in c.get(chat_url(chat)).content.decode()
    services.inject(chat.id, "hello", wake=True)
    assert 'id="suggestions"' not in c.get(chat_url(chat)).content.decode()


def test_the_context_view_and_the_model_picker(chat: Session, make_reviewer: Callable[..., Any], settings: Any) -> None:
    settings.TERRET_LLM_API_KEY = "k"  # test/other-model is the OpenAI-compatible provider's: reachable with a key
    log.append(chat.id, "user/message", {"text": "old question"})
    log.append(chat.id, "session/compacted", {"upto_seq": 2, "summary": "they asked an old question"})
    log.append(chat.id, "user/message", {"text": "new question"})
    c = client_for(chat.owner)
    page = c.get(reverse("sessions:context", args=[chat.id])).content.decode()
    messages = page[page.index('id="context-messages"') :]
    assert "they asked an old question" in messages and "new question" in messages
    assert ">old question</pre>" not in messages  # compacted away: the model sees the summary
    assert "You are an agent running inside Terret" in messages  # the default system prompt
    assert "<code>clock.now</code>" in page and "runs without asking" in page
    assert re.search(r"About <strong>\d+</strong> tokens", page)
    r = c.post(reverse("sessions:model", args=[chat.id]), {"spec": "test/other-model"})
    assert r.status_code == 302
    updated = Event.objects.filter(session=chat, kind="model/updated").get()
    assert updated.data == {"role": "main", "spec": "test/other-model", "by": "owner"}
    assert (
        'id="context-model">test/other-model</code>'
        in c.get(reverse("sessions:context", args=[chat.id])).content.decode()
    )
    r = c.post(reverse("sessions:model", args=[chat.id]), {"spec": "  "})
    assert r.status_code == 400 and "spec must be a non-empty model name" in r.content.decode()
    rita = client_for(make_reviewer("rita"))
    assert rita.get(reverse("sessions:context", args=[chat.id])).status_code == 200
    assert rita.post(reverse("sessions:model", args=[chat.id]), {"spec": "x/y"}).status_code == 403
    assert Event.objects.filter(session=chat, kind="model/updated").count() == 1


def test_styled_403_and_404_without_a_traceback(chat: Session, make_reviewer: Callable[..., Any], caplog: Any) -> None:
    rita = client_for(make_reviewer("rita"))
    with caplog.at_level(logging.WARNING, logger="django.request"):
        r = rita.post(reverse("sessions:message", args=[chat.id]), {"text": "hi"})
    assert r.status_code == 403
    body = r.content.decode()
    assert "Not allowed" in body and 'href="/static/css/terret.css"' in body and "favicon.svg" in body
    assert all(rec.exc_info is None for rec in caplog.records), "a plain 403 logged a traceback"
    r = rita.get("/no/such/page/")
    assert r.status_code == 404 and "Nothing here" in r.content.decode()


def test_a_card_shows_arguments_a_reviewer_edited(chat: Session) -> None:
    sid = chat.id
    log.append(sid, "turn/start", {})
    call = {"id": "e1", "name": "workspace.write", "arguments": '{"path": "a.txt", "content": "model"}'}
    log.append(sid, "assistant/message", {"content": None, "tool_calls": [call]})
    log.append(sid, "approval/requested", {"call_id": "e1", "name": "workspace.write", "args": {"path": "a.txt"}})
    edited = {"path": "a.txt", "content": "reviewer"}
    log.append(sid, "approval/resolved", {"call_id": "e1", "verdict": "approve", "by": "rita", "edited_args": edited})
    log.append(sid, "tool/result", {"call_id": "e1", "name": "workspace.write", "content": "wrote 8 bytes to a.txt"})
    page = client_for(chat.owner).get(chat_url(chat)).content.decode()
    card = found(r'<details class="tool-card" id="call-e1".*?</details>', page)
    assert "approved by rita" in card and "Edited by the reviewer" in card
    assert "&quot;content&quot;: &quot;reviewer&quot;" in card and "&quot;content&quot;: &quot;model&quot;" in card
    assert "wrote 8 bytes" in card and "state-done" in card
