"""/ops/ as a live fleet view (issue 34, part 6), as views: running now
(session, current step or tool, for how long, cost so far), the session table's
status filters and sorting, approvals approved and denied in place (htmx: the
body comes back as an out-of-band swap, no redirect) through the reviewers'
decide verb and logged with the actor, held input freed in place, empty cards
collapsed, a session's timeline (each row expandable to its JSON); staff only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from sessions_app import log, services
from sessions_app.models import AgentProfile, OperatorAction, Session
from sessions_app.services import budgets
from sessions_app.services.fleet import summarize
from sessions_app.services.sessions import rename_session
from sessions_app.web.console_socket import console_frame
from tests.helpers import client_for, events
from tests.sessions_app.apiutil import park_calls

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def opsy(make_user: Any) -> Any:
    user = make_user("opsy", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return user


@pytest.fixture
def ops(opsy: Any) -> Client:
    return client_for(opsy)


def section(html: str, kind: str) -> str:
    found = re.search(rf'<(section|details) class="ops-card[^"]*" id="ops-{kind}".*?</\1>', html, re.S)
    assert found is not None, kind
    return found.group(0)


def test_running_now_lists_each_live_turn(ops: Client, chat: Session) -> None:
    services.run_turn(chat.id, "go")
    log.append(chat.id, "step/start", {"step": 1, "model": "test/model"})
    log.append(chat.id, "step/end", {"step": 1, "usage": {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.25}})
    log.append(chat.id, "step/start", {"step": 2, "model": "test/model"})
    html = ops.get("/ops/").content.decode()
    running = section(html, "running")
    assert f'data-session="{chat.id}"' in running
    assert "model call, step 2" in running and 'so far <span class="ops-cost">$0.2500</span>' in running
    assert re.search(r'for <span class="ops-for">\d+ s</span>', running)
    assert f"/ops/sessions/{chat.id}/timeline/" in running
    log.append(chat.id, "turn/end", {"status": "completed"})
    assert "No turn is running." in section(ops.get("/ops/").content.decode(), "running")


def test_the_session_table_filters_and_sorts(ops: Client, chat: Session, owner: Any, profile: AgentProfile) -> None:
    other = services.create_session(owner, profile)
    rename_session(other.id, "zzz last by title", by="owner")
    rename_session(chat.id, "aaa first by title", by="owner")
    services.run_turn(chat.id, "go")  # chat: running; other: idle
    table = section(ops.get("/ops/?status=running").content.decode(), "sessions")
    assert f'data-session="{chat.id}"' in table and f'data-session="{other.id}"' not in table
    assert 'aria-current="true" class="current">running<' in table
    idle = section(ops.get("/ops/?status=idle").content.decode(), "sessions")
    assert f'data-session="{other.id}"' in idle and f'data-session="{chat.id}"' not in idle
    by_title = section(ops.get("/ops/?sort=title").content.decode(), "sessions")
    assert by_title.index("aaa first by title") < by_title.index("zzz last by title")
    by_events = section(ops.get("/ops/?sort=events").content.decode(), "sessions")
    assert by_events.index(str(chat.id)) < by_events.index(str(other.id))  # chat has more events
    fallback = section(ops.get("/ops/?status=nonsense&sort=nonsense").content.decode(), "sessions")
    assert str(chat.id) in fallback and str(other.id) in fallback  # unknown: all, by last activity


def test_approve_and_deny_in_place(ops: Client, chat: Session) -> None:
    park_calls(chat.id, "c1", "c2")
    assert 'id="ops-approvals"' in (html := ops.get("/ops/").content.decode())
    assert section(html, "approvals").startswith("<section")  # items: a full card
    r = ops.post(f"/ops/sessions/{chat.id}/decide/", {"call_id": "c1", "verdict": "approve", "reason": "ok"}, **HTMX)
    assert r.status_code == 200  # in place: no redirect
    body = r.content.decode()
    assert body.startswith('<p id="ops-status" class="ok"') and "Approved c1" in body
    assert 'id="console-body" hx-swap-oob="true"' in body
    assert 'value="c1"' not in body and 'value="c2"' in body  # the decided one is gone from the card
    r = ops.post(f"/ops/sessions/{chat.id}/decide/", {"call_id": "c2", "verdict": "deny", "reason": "no"}, **HTMX)
    assert "Denied c2" in r.content.decode()
    verdicts = [(e["call_id"], e["verdict"], e.get("by")) for e in events(chat, "approval/resolved")]
    assert verdicts == [("c1", "approve", "opsy"), ("c2", "deny", "opsy")]
    assert list(OperatorAction.objects.order_by("at").values_list("actor", "action", "target", "reason")) == [
        ("opsy", "approve", str(chat.id), "c1: ok"),
        ("opsy", "deny", str(chat.id), "c2: no"),
    ]
    again = ops.post(f"/ops/sessions/{chat.id}/decide/", {"call_id": "c2", "verdict": "deny"}, **HTMX)
    assert 'class="error"' in again.content.decode() and "Nothing done" in again.content.decode()
    assert OperatorAction.objects.count() == 2
    # Without htmx: a flash and back to the console.
    plain = ops.post(f"/ops/sessions/{chat.id}/decide/", {"call_id": "c9", "verdict": "approve"})
    assert plain.status_code == 302 and plain["Location"] == "/ops/"


def test_staff_who_is_not_a_reviewer_gets_no_buttons_and_cannot_decide(make_user: Any, chat: Session) -> None:
    park_calls(chat.id, "c1")
    staff = client_for(make_user("plainstaff", is_staff=True))
    card = section(staff.get("/ops/").content.decode(), "approvals")
    assert "Approve" not in card and "needs the reviewers' permission" in card
    r = staff.post(f"/ops/sessions/{chat.id}/decide/", {"call_id": "c1", "verdict": "approve"}, **HTMX)
    assert "Nothing done" in r.content.decode()
    assert not events(chat, "approval/resolved") and not OperatorAction.objects.exists()


def test_held_input_is_freed_in_place(ops: Client, chat: Session) -> None:
    budgets.set_budget(chat.id, {"turns": 0}, by="owner")
    assert services.inject(chat.id, "hello", wake=True, by="owner").disposition == "held"
    card = section(ops.get("/ops/").content.decode(), "held_input")
    assert "turn budget is exhausted" in card and f"/ops/sessions/{chat.id}/free/" in card
    r = ops.post(f"/ops/sessions/{chat.id}/free/", {"reason": "let it run"}, **HTMX)
    body = r.content.decode()
    assert r.status_code == 200 and "Freed the held input" in body and "lifted the session&#x27;s budget" in body
    assert events(chat, "budget/updated")[-1] == {
        "cost_usd": None, "tokens": None, "steps": None, "turns": None, "by": "opsy",
    }  # fmt: skip
    assert OperatorAction.objects.get().action == "free"
    # No worker ran here, so the input is still held though nothing holds it: freeing again wakes it.
    r = ops.post(f"/ops/sessions/{chat.id}/free/", {"reason": ""}, **HTMX)
    assert "woke the session" in r.content.decode()


def test_freeing_what_a_profile_holds_is_refused_with_what_to_do(ops: Client, chat: Session) -> None:
    ops.post("/ops/suspend/", {"scope": "profile", "target": chat.profile.name, "reason": "look"})
    assert services.inject(chat.id, "hello", wake=True, by="owner").disposition == "held"
    r = ops.post(f"/ops/sessions/{chat.id}/free/", {"reason": ""}, **HTMX)
    assert "Nothing done: held by the profile suspension: resume that scope" in r.content.decode()
    assert list(OperatorAction.objects.values_list("action", flat=True)) == ["suspend"]
    calm = services.create_session(chat.owner, chat.profile)
    r = ops.post(f"/ops/sessions/{calm.id}/free/", {"reason": ""}, **HTMX)
    assert "Nothing done: this session holds no input" in r.content.decode()


def test_held_by_a_suspension_is_resumed_and_freed(ops: Client, chat: Session) -> None:
    ops.post("/ops/suspend/", {"scope": "session", "target": str(chat.id), "reason": "look"})
    assert services.inject(chat.id, "hello", wake=True, by="owner").disposition == "held"
    assert "Resume and free" in section(ops.get("/ops/").content.decode(), "held_input")
    r = ops.post(f"/ops/sessions/{chat.id}/free/", {"reason": ""}, **HTMX)
    assert "resumed the session" in r.content.decode()
    assert Session.objects.get(id=chat.id).suspended_seq is None


def test_empty_cards_collapse(ops: Client, chat: Session) -> None:
    html = ops.get("/ops/").content.decode()
    for kind in ("blocked", "approvals", "held_input", "stalled"):
        assert section(html, kind).startswith('<details class="ops-card ops-empty"'), kind
    park_calls(chat.id, "c1")
    html = ops.get("/ops/").content.decode()
    assert section(html, "approvals").startswith("<section") and section(html, "blocked").startswith("<details")


def test_the_timeline_is_a_compact_history_with_json(ops: Client, chat: Session) -> None:
    park_calls(chat.id, "c1")
    html = ops.get(f"/ops/sessions/{chat.id}/timeline/").content.decode()
    rows = re.findall(r'<li class="[^"]*" data-seq="(\d+)" data-kind="([^"]+)">', html)
    assert [k for _, k in rows] == [k for k in (e.kind for e in chat.events.order_by("seq"))]
    requested = re.search(r'data-kind="approval/requested">.*?</li>', html, re.S)
    assert requested is not None
    assert "<details>" in requested.group(0) and "workspace.write" in requested.group(0)
    assert "&quot;call_id&quot;: &quot;c1&quot;" in requested.group(0)  # the JSON, one click away
    assert re.search(r'data-kind="assistant/message">.*?calls workspace.write', html, re.S)
    assert ops.get(f"/ops/sessions/{chat.id}/timeline/?after=3").content.decode().count("<details>") == len(rows) - 3


def test_staff_only(client: Client, owner: Any, chat: Session, opsy: Any) -> None:
    park_calls(chat.id, "c1")
    mine = client_for(owner)
    assert mine.get(f"/ops/sessions/{chat.id}/timeline/").status_code == 403
    r = mine.post(f"/ops/sessions/{chat.id}/decide/", {"call_id": "c1", "verdict": "approve"}, **HTMX)
    assert r.status_code == 403
    assert mine.post(f"/ops/sessions/{chat.id}/free/", {}).status_code == 403
    assert client.get(f"/ops/sessions/{chat.id}/timeline/").status_code == 302  # the login page
    assert client_for(opsy).get("/ops/sessions/00000000-0000-0000-0000-000000000000/timeline/").status_code == 404
    assert not events(chat, "approval/resolved") and not OperatorAction.objects.exists()
    # The socket's frames: the body for staff, nothing (a refusal) for anyone else.
    assert console_frame(owner.pk, None, None, "all", "recent", "") is None
    frame = console_frame(opsy.pk, None, None, "all", "recent", "tok")
    assert frame is not None and 'id="console-body" hx-swap-oob="true"' in frame
    assert 'name="csrfmiddlewaretoken" value="tok"' in frame  # the plain forms still post


@pytest.mark.parametrize(
    ("kind", "data", "line"),
    [
        ("tool/result", {"call_id": "c1", "name": "clock.now", "content": "2026-01-01"}, "clock.now c1 2026-01-01"),
        ("tool/result", {"call_id": "c2", "name": "x.y", "content": "boom", "is_error": True}, "x.y c2 (error) boom"),
        (
            "step/end",
            {"step": 2, "model": "m/x", "latency_ms": 40, "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
            "step 2 · m/x · 3+4 tokens · unpriced · 40 ms",
        ),
        ("usage/recorded", {"purpose": "title", "usage": None}, "title · usage unknown"),
        ("turn/end", {"status": "failed", "error": "no key"}, "failed no key"),
        ("user/message", {"text": "x" * 500}, "x" * 159 + "…"),
    ],
)
def test_a_timeline_line_reads(kind: str, data: dict[str, Any], line: str) -> None:
    assert summarize(kind, data) == line
