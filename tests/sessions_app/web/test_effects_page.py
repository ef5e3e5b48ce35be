"""The chat page and effects of unknown outcome: while the open turn waits
for an operator (status waiting_reconcile) the page lists each pending
attempt; staff (and the owner with TERRET_OWNER_MAY_RESOLVE) get re-run,
mark done and mark failed, which post to a view that resolves through the
service; the header and the notice follow the log over the page's socket."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from sessions_app import log, services
from sessions_app.actions.words import STATUS_LABELS
from sessions_app.log.reads import event_frames
from sessions_app.models import Session
from sessions_app.services import effects as effect_services
from sessions_app.web.present import ChatFollower, shorten
from tests.helpers import client_for, events, kinds
from tests.sessions_app.apiutil import make_reviewer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

LONG_TEXT = "y" * 500


def waiting_on(session: Session, *call_ids: str) -> None:
    """An open turn whose calls each have an attempt of unknown outcome."""
    sid = session.id
    services.run_turn(sid, "write the files")
    calls = [
        {"id": c, "name": "workspace.write", "arguments": json.dumps({"path": f"{c}.txt", "text": LONG_TEXT})}
        for c in call_ids
    ]
    message = log.append(sid, "assistant/message", {"content": None, "tool_calls": calls}).seq
    for c in call_ids:
        data = {
            "call_id": c,
            "name": "workspace.write",
            "attempt": 1,
            "idempotency_key": f"terret:{sid}:{message}:{c}",
            "replay": "never",
            "fence": 2,
            "step": 1,
            "worker": "worker-b:99",
        }
        log.append(sid, "tool/attempt", data)
    for c in call_ids:
        log.append(sid, "tool/unknown", {"call_id": c, "name": "workspace.write", "attempt": 1})


def page(c: Client, session: Session) -> str:
    r = c.get(reverse("sessions:chat", args=[session.id]))
    assert r.status_code == 200
    return r.content.decode()


def notice(html: str) -> str:
    start = html.index('<section id="effects"')
    return html[start : html.index("</section>", start)]


def resolve_url(session: Session) -> str:
    return reverse("sessions:resolve", args=[session.id])


@pytest.fixture
def operator(make_user: Any) -> Any:
    return make_user("operator", is_staff=True)


def test_the_label() -> None:
    assert STATUS_LABELS["waiting_reconcile"] == "waiting for an operator"


def test_no_notice_while_nothing_waits(chat: Session, operator: Any) -> None:
    html = page(client_for(operator), chat)
    assert "Waiting for an operator" not in notice(html)


def test_staff_see_each_pending_effect_with_the_three_answers(chat: Session, operator: Any) -> None:
    waiting_on(chat, "c1", "c2")
    html = page(client_for(operator), chat)
    assert 'data-status="waiting_reconcile"' in html
    assert 'class="badge waiting_reconcile"' in html and ">waiting for an operator<" in html
    box = notice(html)
    assert "Waiting for an operator" in box
    for c in ("c1", "c2"):
        assert f'data-call-id="{c}"' in box
        assert f'id="rerun-{c}-1"' in box and f'id="done-{c}-1"' in box and f'id="failed-{c}-1"' in box
    assert "<code>workspace.write</code>" in box
    assert "step 1" in box and "worker <code>worker-b:99</code>" in box and "attempted <time" in box
    # The arguments are shortened, not shown whole.
    assert LONG_TEXT not in box
    assert shorten(json.dumps({"path": "c1.txt", "text": LONG_TEXT})) in box.replace("&quot;", '"')
    assert box.count(f'action="{resolve_url(chat)}"') == 6
    assert 'name="result"' in box and 'name="reason"' in box


def test_a_plain_owner_sees_the_notice_without_buttons(chat: Session) -> None:
    waiting_on(chat, "c1")
    box = notice(page(client_for(chat.owner), chat))
    assert 'data-call-id="c1"' in box
    assert "rerun-" not in box and "done-" not in box and "failed-" not in box
    assert "Waiting for an operator to resolve it." in box


def test_the_owner_gets_the_buttons_with_the_setting(chat: Session, settings: Any) -> None:
    settings.TERRET_OWNER_MAY_RESOLVE = True
    waiting_on(chat, "c1")
    box = notice(page(client_for(chat.owner), chat))
    assert 'id="done-c1-1"' in box


def test_a_post_marks_it_done_and_redirects(chat: Session, operator: Any) -> None:
    waiting_on(chat, "c1")
    before = kinds(chat)
    c = client_for(operator)
    r = c.post(resolve_url(chat), {"call_id": "c1", "action": "done", "result": "written"})
    assert r.status_code == 302 and r["Location"] == reverse("sessions:chat", args=[chat.id])
    assert kinds(chat) == [*before, "tool/resolved"]
    assert events(chat, "tool/resolved") == [
        {"call_id": "c1", "attempt": 1, "action": "done", "by": "operator", "result": "written"}
    ]
    chat.refresh_from_db()
    assert chat.status == "running"
    html = page(c, chat)
    assert "Recorded as done." in html  # the message
    assert "Waiting for an operator" not in notice(html)


def test_htmx_gets_the_notice_back(chat: Session, operator: Any) -> None:
    waiting_on(chat, "c1", "c2")
    c = client_for(operator)
    r = c.post(resolve_url(chat), {"call_id": "c1", "action": "rerun"}, headers={"HX-Request": "true"})
    assert r.status_code == 200
    body = r.content.decode()
    assert body.lstrip().startswith('<section id="effects"') and "hx-swap-oob" not in body
    assert "Running the call again." in body
    assert 'data-call-id="c1"' not in body and 'data-call-id="c2"' in body
    # A second answer to the same call: the reason, in the fragment; nothing appended.
    before = kinds(chat)
    again = c.post(resolve_url(chat), {"call_id": "c1", "action": "failed"}, headers={"HX-Request": "true"})
    assert again.status_code == 200 and again["X-Terret-Error"] == "effect_not_pending"
    assert 'role="alert"' in again.content.decode()
    assert kinds(chat) == before


def test_bad_posts_append_nothing(chat: Session, operator: Any) -> None:
    waiting_on(chat, "c1")
    c = client_for(operator)
    before = kinds(chat)
    for data in (
        {"call_id": "c1", "action": "undo"},
        {"call_id": "c1", "action": "rerun", "result": "it ran"},
        {"call_id": "other", "action": "done"},
        {"action": "done"},
    ):
        r = c.post(resolve_url(chat), data, headers={"HX-Request": "true"})
        assert r.status_code == 200 and r["X-Terret-Error"], data
        plain = c.post(resolve_url(chat), data)
        assert plain.status_code == 302
    assert kinds(chat) == before


def test_who_may_post(chat: Session, make_user: Any, settings: Any) -> None:
    waiting_on(chat, "c1")
    url = resolve_url(chat)
    data = {"call_id": "c1", "action": "done"}
    before = kinds(chat)
    anonymous = Client().post(url, data)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))
    assert client_for(chat.owner).post(url, data).status_code == 403
    assert client_for(make_reviewer(make_user("rita"))).post(url, data).status_code == 403
    assert client_for(make_user("stranger")).post(url, data).status_code == 404
    assert client_for(chat.owner).get(url).status_code == 405
    assert kinds(chat) == before
    settings.TERRET_OWNER_MAY_RESOLVE = True
    assert client_for(chat.owner).post(url, data).status_code == 302
    assert events(chat, "tool/resolved")[-1]["by"] == chat.owner.username


def test_the_plain_form_needs_csrf(chat: Session, operator: Any) -> None:
    waiting_on(chat, "c1")
    c = Client(enforce_csrf_checks=True)
    c.force_login(operator)
    before = kinds(chat)
    assert c.post(resolve_url(chat), {"call_id": "c1", "action": "done"}).status_code == 403
    assert kinds(chat) == before


def test_the_socket_brings_the_header_and_the_notice_up_to_date(chat: Session, operator: Any) -> None:
    follower = ChatFollower(chat.id, operator)
    after = chat.last_seq
    waiting_on(chat, "c1")
    html = "".join(f.html for f in follower.events(event_frames(chat.id, after)))
    assert 'data-status="waiting_reconcile"' in html and ">waiting for an operator<" in html
    swap = re.search(r'<section id="effects"[^>]*>', html)
    assert swap is not None and 'hx-swap-oob="true"' in swap.group(0)
    assert 'id="done-c1-1"' in html
    seq = Session.objects.get(id=chat.id).last_seq
    client_for(operator).post(resolve_url(chat), {"call_id": "c1", "action": "failed", "reason": "no"})
    html = "".join(f.html for f in follower.events(event_frames(chat.id, seq)))
    assert 'data-status="running"' in html
    assert '<section id="effects"' in html and 'data-call-id="c1"' not in html.split('<section id="effects"')[1]


def test_the_ledger_rows_read_as_sentences(chat: Session, operator: Any) -> None:
    """The intent is bookkeeping (hidden unless all events are shown); the
    unknown outcome and its resolution are part of the conversation."""
    waiting_on(chat, "c1")
    effect_services.resolve(chat.id, "c1", "failed", reason="the target says no", by="operator")
    html = page(client_for(operator), chat)
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<li id="ev-\d+"[^>]*data-kind="([^"]+)"[^>]*>', html)}
    assert " meta" in rows["tool/attempt"]
    assert " meta" not in rows["tool/unknown"] and " meta" not in rows["tool/resolved"]
    assert "Attempt 1 of <code>workspace.write</code> (replay never)" in html
    assert "Outcome of <code>workspace.write</code> (attempt 1) unknown" in html
    assert "Resolved by operator: marked failed (the target says no)" in html
