"""Issue 34, part 4: badges and tables say what holds a session (never a
plain "idle" over a hold), a held input is one row with its reason and what
frees it, and costs read "$X + N unpriced". Part 7: search covers messages."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from sessions_app import log, services
from sessions_app.actions.words import shown_state
from sessions_app.models import Session
from sessions_app.services import budgets, inject
from sessions_app.services import operators as ops
from tests.helpers import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

NO_LIMITS = {"cost_usd": None, "tokens": None, "steps": None, "turns": None}


def badge(html: str, session: Session, prefix: str = "row") -> str:
    row = re.search(rf'id="{prefix}-{session.id}".*?</tr>', html, re.S)
    assert row, html
    found = re.search(r'<span class="badge ([a-z_]+)">([^<]+)</span>', row.group(0))
    assert found
    return f"{found.group(1)}:{found.group(2)}"


def chat_badge(html: str) -> str:
    found = re.search(r'<span id="status" class="badge ([a-z_]+)" role="status">([^<]+)</span>', html)
    assert found
    return f"{found.group(1)}:{found.group(2)}"


def test_holds_read_as_holds_on_the_list_the_dashboard_and_the_chat(owner: Any, chat: Session, profile: Any) -> None:
    c = client_for(owner)
    idle = services.create_session(owner, profile)

    def everywhere(session: Session) -> set[str]:
        return {
            badge(c.get(reverse("sessions:list")).content.decode(), session),
            badge(c.get(reverse("dashboard:index")).content.decode(), session, "dash-row"),
            chat_badge(c.get(reverse("sessions:chat", args=[session.id])).content.decode()),
        }

    assert everywhere(idle) == {"idle:idle"}

    budgets.set_budget(chat.id, {**NO_LIMITS, "turns": 0})
    assert inject(chat.id, "hello", wake=True, by="owner").disposition == "held"
    assert Session.objects.get(id=chat.id).status == "idle"  # the model's own word, which hid the hold
    assert everywhere(chat) == {"held:held (budget)"}

    ops.suspend("session", str(chat.id), by="op", reason="checking")
    assert everywhere(chat) == {"suspended:held (suspended)"}
    ops.resume("session", str(chat.id), by="op")
    ops.revoke(chat.id, by="op", reason="leak")
    assert everywhere(chat) == {"revoked:revoked"}


@pytest.mark.parametrize("scope", ["profile", "global"])
def test_input_held_by_a_profile_or_global_suspension_reads_held_suspended(
    owner: Any, chat: Session, profile: Any, scope: str
) -> None:
    c = client_for(owner)
    target = profile.name if scope == "profile" else ""
    ops.suspend(scope, target, by="op", reason="maintenance")
    try:
        assert inject(chat.id, "hello", wake=True, by="owner").disposition == "held"
        session = Session.objects.get(id=chat.id)
        assert session.held_seq is not None
        assert shown_state(session) == ("suspended", "held (suspended)")
        assert chat_badge(c.get(reverse("sessions:chat", args=[chat.id])).content.decode()) == (
            "suspended:held (suspended)"
        )
        assert badge(c.get(reverse("sessions:list")).content.decode(), chat) == "suspended:held (suspended)"
    finally:
        ops.resume(scope, target, by="op")


def test_an_open_turn_no_worker_has_taken_waits_for_a_worker(owner: Any, chat: Session) -> None:
    log.append(chat.id, "turn/start", {"by": "test"})
    session = Session.objects.get(id=chat.id)
    assert session.status == "running" and not session.lease_owner
    assert shown_state(session) == ("waiting_worker", "waiting for a worker")
    html = client_for(owner).get(reverse("sessions:chat", args=[chat.id])).content.decode()
    assert chat_badge(html) == "waiting_worker:waiting for a worker"


def test_a_held_input_is_one_row_with_its_reason_and_what_frees_it(owner: Any, chat: Session) -> None:
    budgets.set_budget(chat.id, {**NO_LIMITS, "turns": 0})
    inject(chat.id, "please run", wake=True, by="owner")
    html = client_for(owner).get(reverse("sessions:chat", args=[chat.id])).content.decode()
    shown = [li for li in re.findall(r'<li id="ev-\d+".*?</li>', html, re.S) if ' meta"' not in li.split(">")[0]]
    held = [li for li in shown if "please run" in li or "Held" in li]
    assert len(held) == 1, held  # the input/held row is quiet: its words are on the input's row
    assert "turn budget is exhausted" in held[0]
    assert 'class="free-hold"' in held[0] and "Raise the budget" in held[0]
    assert "rides the agent" not in held[0]  # not "queued" while a budget holds it


def test_one_unpriced_call_leaves_the_total_priced_plus_one_unpriced(owner: Any, chat: Session) -> None:
    log.append(chat.id, "turn/start", {"by": "test"})
    usage = {"prompt_tokens": 10, "completion_tokens": 2}
    log.append(chat.id, "step/end", {"step": 1, "usage": {**usage, "cost": 0.25}})
    log.append(chat.id, "step/end", {"step": 2, "usage": {**usage, "cost": None}})
    log.append(chat.id, "turn/end", {"status": "completed"})
    c = client_for(owner)
    for url in (reverse("sessions:chat", args=[chat.id]), reverse("sessions:list"), reverse("dashboard:index")):
        html = c.get(url).content.decode()
        assert "$0.2500 + 1 unpriced" in html, url
        assert ">unpriced<" not in html


def test_search_finds_a_session_by_what_was_said(owner: Any, chat: Session, profile: Any, make_user: Any) -> None:
    other = services.create_session(owner, profile)
    log.append(chat.id, "user/message", {"text": "where is the Zanzibar report?"})
    log.append(other.id, "assistant/message", {"content": "the quarterly ledger", "tool_calls": []})
    c = client_for(owner)
    html = c.get(reverse("sessions:list"), {"q": "zanzibar"}).content.decode()
    assert f"row-{chat.id}" in html and f"row-{other.id}" not in html
    html = c.get(reverse("sessions:list"), {"q": "Quarterly"}).content.decode()
    assert f"row-{other.id}" in html and f"row-{chat.id}" not in html
    # another user's messages are never searched into view
    stranger = client_for(make_user("mallory"))
    assert f"row-{chat.id}" not in stranger.get(reverse("sessions:list"), {"q": "zanzibar"}).content.decode()


def test_the_list_groups_a_family_under_its_root(owner: Any, profile: Any) -> None:
    """Issue 34, part 2: forks are listed under the session they came from."""
    root = services.create_session(owner, profile)
    other = services.create_session(owner, profile)
    fork = services.create_session(owner, profile)
    log.append(fork.id, "session/forked", {"parent": str(root.id), "at_seq": 1, "policy": "historical", "seed_upto": 1})
    # The fork and the other session are newer, so by activity alone they would come first.
    for s, title in ((root, "Root talk"), (other, "Other talk"), (fork, "Root talk (fork)")):
        log.append(s.id, "session/titled", {"title": title})
    html = client_for(owner).get(reverse("sessions:list")).content.decode()
    order = re.findall(r'<tr id="row-([0-9a-f-]{36})"', html)
    assert order.index(str(fork.id)) == order.index(str(root.id)) + 1
    fork_row = re.search(rf'<tr id="row-{fork.id}"[^>]*>', html)
    assert fork_row and 'class="fork-row"' in fork_row.group(0) and f'<tr id="row-{root.id}">' in html


def test_a_turn_with_no_progress_reads_stalled_until_something_happens(owner: Any, chat: Session) -> None:
    log.append(chat.id, "turn/start", {"by": "test"})
    # A worker holds the lease (the runtime writes these columns; the log has no event for them).
    Session.objects.filter(id=chat.id).update(lease_owner="worker-1")
    log.append(chat.id, "turn/stalled", {"since": "2026-12-05T12:00:00+00:00", "phase": "model"})
    c = client_for(owner)
    assert chat_badge(c.get(reverse("sessions:chat", args=[chat.id])).content.decode()) == "stalled:stalled"
    assert badge(c.get(reverse("sessions:list")).content.decode(), chat) == "stalled:stalled"
    log.append(chat.id, "step/start", {"step": 1, "model": "test/model"})  # progress: the report no longer stands
    assert chat_badge(c.get(reverse("sessions:chat", args=[chat.id])).content.decode()) == "running:running"
