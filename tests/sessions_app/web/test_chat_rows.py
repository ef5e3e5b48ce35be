"""Issue 34, part 1: bookkeeping events read as short sentences (never raw
JSON), scheduled input is labelled as such (never "You"), on the page and
over its socket; the composer's notice is emptied once its input is answered."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from sessions_app import log
from sessions_app.log.reads import event_frames
from sessions_app.models import Session
from sessions_app.services import budgets
from sessions_app.services import operators as ops
from sessions_app.web.present import NOTICE_CLEARED, ChatFollower
from tests.helpers import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

NO_LIMITS = {"cost_usd": None, "tokens": None, "steps": None, "turns": None}


def row(html: str, kind: str) -> str:
    found = re.findall(rf'<li id="ev-\d+" data-seq="\d+" data-kind="{kind}".*?</li>', html, re.S)
    assert found, kind
    return found[-1]


def who(li: str) -> str:
    found = re.search(r'<span class="who">(.*?)</span>\s*(?:<span class="mark|<a class="seq")', li, re.S)
    assert found
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def test_bookkeeping_events_read_as_sentences(owner: Any, chat: Session) -> None:
    budgets.set_budget(chat.id, {**NO_LIMITS, "turns": 5, "cost_usd": 1.5}, by="owner")
    log.append(
        chat.id,
        "schedule/created",
        {"schedule_id": "s1", "by": "owner", "every_seconds": 60, "misfire": "skip", "reason": "poll the build"},
    )
    log.append(chat.id, "schedule/cancelled", {"schedule_id": "s1", "by": "owner", "reason": "done"})
    ops.suspend("session", str(chat.id), by="op", reason="audit")
    html = client_for(owner).get(reverse("sessions:chat", args=[chat.id])).content.decode()
    budget = row(html, "budget/updated")
    assert "Budget set by owner: cost $1.5, turns 5." in budget and "json" not in budget and " meta" not in budget
    assert "Wake-up scheduled by owner, every 60 s: poll the build." in row(html, "schedule/created")
    assert "Schedule cancelled by owner: done." in row(html, "schedule/cancelled")
    assert "Suspended by op: audit: input is held" in row(html, "session/suspended")
    assert '"schedule_id"' not in html.split('id="log"')[1].split("</ol>")[0]  # no raw JSON rows


def test_scheduled_input_is_labelled_scheduled_never_you(owner: Any, chat: Session) -> None:
    by = "schedule:6f1c"
    deferred = log.append(
        chat.id, "input/deferred", {"text": "nightly check", "lane": "follow_up", "by": by, "schedule_id": "6f1c"}
    )
    follower = ChatFollower(chat.id, owner)
    after = Session.objects.get(id=chat.id).last_seq
    log.append(chat.id, "turn/start", {"by": "test"})
    log.append(chat.id, "user/message", {"text": "nightly check", "source_seq": deferred.seq, "lane": "follow_up"})
    log.append(chat.id, "user/message", {"text": "typed by a person"})
    html = client_for(owner).get(reverse("sessions:chat", args=[chat.id])).content.decode()
    placed = re.findall(r'<li id="ev-\d+" data-seq="\d+" data-kind="user/message".*?</li>', html, re.S)
    assert [who(li) for li in placed] == ["Scheduled", "You"]
    assert who(row(html, "input/deferred")) == "Scheduled"
    # ... and the same over the page's socket.
    live = "".join(f.html for f in follower.events(event_frames(chat.id, after)))
    sent = re.findall(r'<li id="ev-\d+" data-seq="\d+" data-kind="user/message".*?</li>', live, re.S)
    assert [who(li) for li in sent][:2] == ["Scheduled", "You"]


def test_the_composer_notice_is_emptied_once_its_input_lands(owner: Any, chat: Session) -> None:
    log.append(chat.id, "turn/start", {"by": "test"})
    r = client_for(owner).post(
        reverse("sessions:message", args=[chat.id]),
        {"text": "steer this", "key": "k1", "lane": "steer"},
        HTTP_HX_REQUEST="true",
    )
    assert "Queued: your message rides the agent" in r.content.decode()
    follower = ChatFollower(chat.id, owner)
    after = Session.objects.get(id=chat.id).last_seq
    queued = Session.objects.get(id=chat.id).last_input_seq
    log.append(chat.id, "step/start", {"step": 1, "model": "test/model"})
    assert NOTICE_CLEARED not in "".join(f.html for f in follower.events(event_frames(chat.id, after)))
    after = Session.objects.get(id=chat.id).last_seq
    log.append(chat.id, "context/injected", {"text": "steer this", "source_seq": queued})
    assert NOTICE_CLEARED in "".join(f.html for f in follower.events(event_frames(chat.id, after)))


def test_the_files_panel_lists_the_workspace_with_version_and_writer(owner: Any, chat: Session, make_user: Any) -> None:
    """Issue 34, part 3: the session's documents, each at its head, with its
    size, version and who committed it."""
    from sessions_app.runtime import documents

    for text in ("remember", "remember the milk"):
        documents.write(chat.id, "notes/todo.txt", text.encode(), by="agent")
    documents.write(chat.id, "stray.bin", b"x" * 2048, by="alice")
    html = client_for(owner).get(reverse("sessions:chat", args=[chat.id])).content.decode()
    table = re.search(r'<table class="files-table".*?</table>', html, re.S)
    assert table, "the panel lists the files"
    rows = re.findall(
        r"<tr><td><a [^>]*><code>(.*?)</code></a>.*?<td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>", table.group(0)
    )
    assert rows == [
        ("notes/todo.txt", "17\xa0bytes", "v2", "the agent"),
        ("stray.bin", "2.0\xa0KB", "v1", "alice"),
    ]
    # another user sees nothing of it
    assert client_for(make_user("mallory")).get(reverse("sessions:chat", args=[chat.id])).status_code == 404
