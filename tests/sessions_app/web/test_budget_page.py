"""The chat page's budget panel: spent against limit for cost, tokens, steps
and turns ("unpriced" never shown as $0), what is exhausted, and for the
owner or staff a form that sets the four limits through the service (blank:
no limit; errors shown in the form, htmx answered 200). A turn ended by a
budget and held input read in words in the log."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.urls import reverse

from sessions_app import log
from sessions_app.log.reads import event_frames
from sessions_app.models import Session
from sessions_app.services import budgets, inject
from sessions_app.web.present import ChatFollower
from tests.helpers import client_for, events
from tests.sessions_app.apiutil import make_reviewer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

NO_LIMITS = {"cost_usd": None, "tokens": None, "steps": None, "turns": None}
HTMX = {"HTTP_HX_REQUEST": "true"}


def page(c: Any, session: Session) -> str:
    r = c.get(reverse("sessions:chat", args=[session.id]))
    assert r.status_code == 200
    return r.content.decode()


def row(html: str, name: str) -> str:
    found = re.search(rf'<tr id="budget-{name}">(.*?)</tr>', html, re.S)
    assert found, f"no budget row {name}"
    return " ".join(found.group(1).split())


def cells(html: str, name: str) -> tuple[str, str]:
    """(spent, limit) of one budget's row."""
    spent = re.search(r'<td class="spent">(.*?)</td>', row(html, name))
    limit = re.search(r'<td class="limit">(.*?)</td>', row(html, name))
    assert spent and limit
    return spent.group(1), limit.group(1)


def test_the_page_shows_spent_against_limit_and_the_form(owner, chat):
    budgets.set_budget(chat.id, {**NO_LIMITS, "cost_usd": 2, "turns": 5})
    html = page(client_for(owner), chat)
    assert 'id="budget"' in html
    assert cells(html, "cost_usd") == ("$0.0000", "$2")
    assert cells(html, "tokens") == ("0", "no limit")
    assert cells(html, "turns") == ("0", "5")
    assert 'id="budget-form"' in html and 'name="tokens"' in html and 'name="cost_usd"' in html
    assert 'value="5"' in html  # the form starts from the current limits


def test_unpriced_spend_is_counted_beside_the_priced(owner, chat):
    Session.objects.filter(id=chat.id).update(unpriced_entries=2)
    html = page(client_for(owner), chat)
    assert cells(html, "cost_usd") == ("$0.0000 + 2 unpriced", "no limit")


def test_an_exhausted_budget_is_said_in_words(owner, chat):
    budgets.set_budget(chat.id, {**NO_LIMITS, "turns": 0})
    html = page(client_for(owner), chat)
    assert 'id="budget-exhausted"' in html and "turn budget is exhausted" in html


def test_a_reviewer_sees_the_figures_but_no_form_and_may_not_post(make_user, chat):
    reviewer = make_reviewer(make_user("reviewer"))
    c = client_for(reviewer)
    html = page(c, chat)
    assert 'id="budget-figures"' in html and 'id="budget-form"' not in html
    r = c.post(reverse("sessions:budget", args=[chat.id]), {"turns": "3"})
    assert r.status_code == 403
    assert events(chat, "budget/updated") == []


def test_posting_the_form_sets_the_budget_once_with_by(owner, chat):
    c = client_for(owner)
    r = c.post(
        reverse("sessions:budget", args=[chat.id]), {"cost_usd": "1.25", "tokens": "", "steps": "9", "turns": ""}
    )
    assert r.status_code == 302
    assert events(chat, "budget/updated") == [
        {"cost_usd": 1.25, "tokens": None, "steps": 9, "turns": None, "by": "owner"}
    ]


def test_htmx_posts_get_the_panel_back_with_a_notice_or_the_error(owner, chat):
    c = client_for(owner)
    ok = c.post(reverse("sessions:budget", args=[chat.id]), {"turns": "2"}, **HTMX)
    assert ok.status_code == 200 and "Budget saved." in ok.content.decode()
    assert 'id="budget"' in ok.content.decode()
    bad = c.post(reverse("sessions:budget", args=[chat.id]), {"turns": "-1", "tokens": "x"}, **HTMX)
    assert bad.status_code == 200 and bad["X-Terret-Error"] == "invalid_input"
    assert 'role="alert"' in bad.content.decode()
    assert len(events(chat, "budget/updated")) == 1


def test_a_stranger_gets_404(make_user, chat):
    r = client_for(make_user("stranger")).post(reverse("sessions:budget", args=[chat.id]), {"turns": "1"})
    assert r.status_code == 404


def test_held_input_and_a_budget_turn_end_read_in_words(owner, chat):
    budgets.set_budget(chat.id, {**NO_LIMITS, "turns": 0})
    receipt = inject(chat.id, "hello", wake=True, by="owner")
    assert receipt.disposition == "held"
    log.append(chat.id, "turn/start", {"by": "test"})
    reason = {"budget": "steps", "scope": "profile", "limit": 3, "spent": 3}
    message = "the profile's daily step budget is exhausted: 3 of 3"
    log.append(chat.id, "turn/end", {"status": "failed", "error": message, "reason": reason})
    html = page(client_for(owner), chat)
    held = re.search(r'data-kind="input/held".*?</li>', html, re.S)
    assert held and "Held: " in held.group(0) and "turn budget is exhausted" in held.group(0)
    end = re.search(r'data-kind="turn/end".*?</li>', html, re.S)
    assert end and "stopped by a budget: the profile&#x27;s daily step budget is exhausted: 3 of 3" in end.group(0)
    assert end.group(0).count("step budget is exhausted") == 1  # the reason, not the error as well


def test_the_message_form_says_when_input_is_held(owner, chat):
    budgets.set_budget(chat.id, {**NO_LIMITS, "turns": 0})
    r = client_for(owner).post(reverse("sessions:message", args=[chat.id]), {"text": "hi", "key": "k1"}, **HTMX)
    assert r.status_code == 200 and "Held: " in r.content.decode()


def test_the_page_socket_updates_the_figures_when_the_budget_changes(owner, chat):
    follower = ChatFollower(chat.id, owner)
    after = Session.objects.get(id=chat.id).last_seq
    budgets.set_budget(chat.id, {**NO_LIMITS, "tokens": 100})
    fragments = follower.events(event_frames(chat.id, after))
    figures = [f.html for f in fragments if 'id="budget-figures"' in f.html]
    assert figures and 'hx-swap-oob="true"' in figures[0] and "100" in figures[0]


def test_the_admin_profile_form_has_the_daily_budgets_and_refuses_negative_ones(profile):
    from django.forms.models import model_to_dict

    from sessions_app.admin import AgentProfileForm

    assert {"daily_cost_usd", "daily_tokens", "daily_steps", "daily_turns"} <= set(AgentProfileForm.base_fields)
    data = {k: v for k, v in model_to_dict(profile).items() if v is not None}
    for field in ("roles", "builtin_tools", "mcp_servers", "approvals", "context_windows"):
        if field in data:
            data[field] = json.dumps(data[field])
    form = AgentProfileForm({**data, "daily_turns": "-1", "daily_cost_usd": "2.5"}, instance=profile)
    assert not form.is_valid() and "daily_turns" in form.errors and "daily_cost_usd" not in form.errors
