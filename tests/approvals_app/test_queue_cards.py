"""The reviewer's forms (edit the arguments, allow for the session), the
queue's cards with the assistant's text, and the navigation bar's live
pending count (template tag and /ws/approvals/?count=1)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group
from django.test import Client

from approvals_app import services as approvals
from approvals_app.selectors import pending, pending_count
from sessions_app import log, services
from sessions_app.models import Session
from sessions_app.services.tokens import issue_token
from tests.approvals_app.conftest import count, events, park

HTMX = {"HTTP_HX_REQUEST": "true"}
EDIT = {"path": "a.txt", "content": "the reviewer's"}


@pytest.fixture
def rclient(client: Client, reviewer: Any) -> Client:
    client.force_login(reviewer)
    return client


def decide_url(session: Session) -> str:
    return f"/approvals/sessions/{session.id}/decide/"


def form(seq: int, verdict: str, edited: str = "", origin: str = "queue") -> dict[str, Any]:
    return {"call_id": "c1", "seq": seq, "verdict": verdict, "edited_args": edited, "from": origin, "reason": ""}


# ---------------------------------------------------------------- the forms


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_the_form_approves_with_the_edited_json(rclient: Client, session: Session) -> None:
    seq = park(session.id, "c1")
    response = rclient.post(decide_url(session), form(seq, "approve", json.dumps(EDIT)), **HTMX)
    assert response.status_code == 200 and "Approved with your edits." in response.content.decode()
    assert events(session, "approval/resolved")[0]["edited_args"] == EDIT


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_the_form_unchanged_box_is_no_edit_and_a_denial_ignores_it(rclient: Client, session: Session) -> None:
    seq = park(session.id, "c1", args={"path": "a.txt", "content": "x"})
    unchanged = json.dumps({"path": "a.txt", "content": "x"}, indent=2)
    rclient.post(decide_url(session), form(seq, "approve", unchanged), **HTMX)
    assert "edited_args" not in events(session, "approval/resolved")[0]
    seq = park(session.id, "c2", new_turn=False)  # the turn is still open: the log refuses a second
    rclient.post(decide_url(session), {**form(seq, "deny", "{not json"), "call_id": "c2"}, **HTMX)
    assert events(session, "approval/resolved")[1]["verdict"] == "deny"


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
@pytest.mark.parametrize(
    ("edited", "needle"),
    [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object"), ('{"path": 3}', "do not fit")],
)
def test_a_bad_edit_is_shown_in_the_fragment_and_appends_nothing(
    rclient: Client, session: Session, edited: str, needle: str
) -> None:
    seq = park(session.id, "c1")
    before = count(session)
    response = rclient.post(decide_url(session), form(seq, "approve", edited, origin="inline"), **HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and response["X-Terret-Error"] == "invalid_input"
    assert 'role="alert"' in html and needle in html
    assert count(session) == before and len(pending(session.id)) == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_a_bad_edit_without_javascript_redirects_with_the_message(rclient: Client, session: Session) -> None:
    seq = park(session.id, "c1")
    response = rclient.post(decide_url(session), form(seq, "approve", "{nope"), follow=True)
    assert "not valid JSON" in response.content.decode()
    assert len(pending(session.id)) == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_allow_for_session_button(rclient: Client, session: Session) -> None:
    seq = park(session.id, "c1")
    response = rclient.post(decide_url(session), form(seq, "approve_session"), **HTMX)
    assert "no longer asks in this session" in response.content.decode()
    assert events(session, "policy/updated")[0]["auto_approve"] == ["workspace.write"]
    assert events(session, "approval/resolved")[0]["verdict"] == "approve"
    # The policy editor lists it with "Ask again".
    html = rclient.get(f"/sessions/{session.id}/policy/").content.decode()
    assert "Allowed without asking" in html and 'name="ask_again" value="workspace.write"' in html
    rclient.post(f"/sessions/{session.id}/policy/", {"ask_again": "workspace.write"}, **HTMX)
    assert "auto_approve" not in events(session, "policy/updated")[-1]


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_every_card_has_the_edit_box_and_the_allow_button(rclient: Client, session: Session) -> None:
    park(session.id, "c1", args={"path": "a.txt", "content": "<script>x</script>"})
    html = rclient.get("/approvals/").content.decode()
    assert html.count('class="approval-card"') == 1
    assert 'name="edited_args"' in html and "&lt;script&gt;" in html and "<script>x" not in html
    assert 'value="approve_session"' in html
    inline = rclient.get(f"/approvals/sessions/{session.id}/").content.decode()
    assert 'name="edited_args"' in inline and 'value="approve_session"' in inline


# ---------------------------------------------------------------- the assistant's text


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_the_queue_shows_what_the_assistant_said_when_it_made_the_call(rclient: Client, session: Session) -> None:
    with log.locked(session.id) as tx:
        tx.append("turn/start", {})
        tx.append("user/message", {"text": "tidy up"})
        tx.append("step/start", {"step": 1, "model": "test/model"})
        tx.append("assistant/message", {"content": "I will <b>rewrite</b> the notes first.", "tool_calls": []})
    park(session.id, "c1", new_turn=False)
    with log.locked(session.id) as tx:  # said after the call: not the call's text
        tx.append("assistant/message", {"content": "Later words.", "tool_calls": []})
    html = rclient.get("/approvals/").content.decode()
    assert "The assistant said" in html and "I will &lt;b&gt;rewrite&lt;/b&gt; the notes first." in html
    assert "Later words." not in html


# ---------------------------------------------------------------- the pending count


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_the_nav_shows_the_count_to_reviewers_only(
    rclient: Client, session: Session, make_user: Any, profile: Any
) -> None:
    park(session.id, "c1")
    park(session.id, "c2", new_turn=False)
    html = rclient.get("/").content.decode()
    assert 'id="pending-count" data-count="2"' in html and "terret-approvals.js" in html
    assert 'data-socket="/ws/approvals/?count=1"' in html
    owner = Client()
    owner.force_login(session.owner)
    assert 'id="pending-count"' not in owner.get("/").content.decode()


@pytest.mark.django_db
@pytest.mark.usefixtures("manual_worker")
def test_pending_count_counts_only_what_the_user_may_decide(
    session: Session, reviewer: Any, make_user: Any, profile: Any
) -> None:
    park(session.id, "c1")
    other = services.create_session(make_user("bob"), profile)
    park(other.id, "c9")
    assert pending_count(reviewer) == 2
    assert pending_count(session.owner) == 0
    approvals.decide(session.id, "c1", "approve", user=reviewer)
    assert pending_count(reviewer) == 1


@pytest.fixture
def count_setup(make_user: Any, make_reviewer: Any, profile: Any, settings: Any) -> dict[str, Any]:
    settings.TERRET_WORKER = "manual"
    reviewer = make_reviewer("rev")
    session = services.create_session(make_user("owner"), profile)
    return {"reviewer": reviewer, "session": session, "token": issue_token(reviewer)[1]}


async def count_socket(token: str) -> WebsocketCommunicator:
    from terret_site.asgi import application

    comm = WebsocketCommunicator(application, f"/ws/approvals/?count=1&token={token}")
    connected, _ = await comm.connect()
    assert connected
    return comm


@pytest.mark.django_db(transaction=True)
async def test_the_count_socket_sends_the_count_on_connect_and_on_every_change(count_setup: dict[str, Any]) -> None:
    sid = count_setup["session"].id
    comm = await count_socket(count_setup["token"])
    assert json.loads(await comm.receive_from(10)) == {"type": "pending", "count": 0}
    await asyncio.sleep(0.2)  # joined the group
    await sync_to_async(park)(sid, "c1")
    assert json.loads(await comm.receive_from(10)) == {"type": "pending", "count": 1}
    await sync_to_async(approvals.decide)(sid, "c1", "deny", user=count_setup["reviewer"])
    assert json.loads(await comm.receive_from(10)) == {"type": "pending", "count": 0}
    assert await comm.receive_nothing(0.5)
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_count_socket_closes_when_the_permission_goes(count_setup: dict[str, Any]) -> None:
    comm = await count_socket(count_setup["token"])
    await comm.receive_from(10)
    await asyncio.sleep(0.2)
    await sync_to_async(lambda: count_setup["reviewer"].groups.remove(Group.objects.get(name="reviewers")))()
    await sync_to_async(park)(count_setup["session"].id, "c1")
    frame = json.loads(await comm.receive_from(10))
    assert frame["type"] == "error" and frame["code"] == "not_allowed"
    assert await comm.receive_output(10) == {"type": "websocket.close", "code": 4403}


@pytest.mark.django_db
def test_the_nav_survives_a_database_outage(reviewer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Error pages render the bar too: a failing count shows "?" instead of a 500."""
    from django.db import DatabaseError
    from django.template import Context, Template

    from approvals_app.templatetags import approvals as tags

    def down(user: Any) -> int:
        raise DatabaseError("the database went away")

    monkeypatch.setattr(tags, "pending_count", down)
    html = Template("{% load approvals %}{% approvals_nav %}").render(Context({"user": reviewer}))
    assert 'id="pending-count" data-count=""' in html and ">?</span>" in html
