"""The dashboard (/dashboard/) and the compact endpoint (/sessions/<id>/compact/).

Every figure on the dashboard comes from running totals kept by the append
transaction (Session columns, UsageDay rows); no page view reads a log. The
per-day series and per-profile totals over all sessions are shown to users
who may view every session (staff, reviewers); others see totals over their
own sessions only. Budgets show spent against limit (services.budgets):
a session's own on its row, today's per profile and, for the same users as
the per-day series, the installation's (TERRET_DAILY_*).

Live updates: the page holds a websocket to /ws/dashboard/ (sockets/
dashboard.py), which sends the body partial rendered again after each burst
of commits, and every 30 s since hints can be lost (dashboard_fragment).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import F
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from sessions_app import actions
from sessions_app.actions.words import compact_outcome, shown_state
from sessions_app.live.paths import socket_url
from sessions_app.models import Agent, Session
from sessions_app.services.budgets import BudgetView, daily_budgets, session_budget
from sessions_app.services.usage import (
    Totals,
    day_series,
    profile_totals_from_days,
    profile_totals_from_sessions,
    totals_of,
)
from sessions_app.web.charts import cost_chart
from sessions_app.web.listing import LIST_PAGE_PREFIX, list_fragment

PAGE_SIZE = 50
CHART_DAYS = 30


@dataclass(frozen=True)
class SessionRow:
    session: Session
    agent_id: str
    totals: Totals
    can_drive: bool
    budget: BudgetView

    @property
    def status_label(self) -> str:
        return shown_state(self.session)[1]

    @property
    def state(self) -> str:
        return shown_state(self.session)[0]


def _agent_id(session: Session) -> str:
    try:
        return session.agent.agent_id
    except Agent.DoesNotExist:  # disposed: the session stays on the dashboard
        return ""


def sees_everything(user: Any) -> bool:
    return actions.sees_all(user)


def dashboard_context(user: Any, page_number: Any) -> dict[str, Any]:
    sessions = actions.visible(user, Session.objects.all())
    listing = sessions.select_related("profile", "agent", "owner").order_by(
        F("last_event_at").desc(nulls_last=True), "-created_at"
    )
    page = Paginator(listing, PAGE_SIZE).get_page(page_number)
    rows = [
        SessionRow(s, _agent_id(s), totals_of(s), actions.allowed(user, s, "drive"), session_budget(s))
        for s in page.object_list
    ]
    everything = sees_everything(user)
    per_profile = profile_totals_from_days() if everything else profile_totals_from_sessions(sessions)
    # today's spend against the daily limits: every budgeted profile and the
    # installation's for staff and reviewers, the profiles of one's own sessions otherwise
    names = None if everything else [name for name, _ in per_profile]
    budgets = daily_budgets(names, include_global=everything)
    grand = sum((t for _, t in per_profile), Totals())
    context: dict[str, Any] = {
        "page": page,
        "rows": rows,
        "per_profile": per_profile,
        "grand": grand,
        "budgets": budgets,
        "everything": everything,
        "show_owner": everything,
        "socket_url": socket_url("dashboard"),
    }
    if everything:
        days = day_series(CHART_DAYS)
        context["days"] = list(reversed(days))
        context["chart"] = cost_chart(days, title=f"Cost per day, last {CHART_DAYS} days (UTC)")
    return context


@login_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    context = dashboard_context(request.user, request.GET.get("page"))
    template = "dashboard/index.html#body" if getattr(request, "htmx", False) else "dashboard/index.html"
    return render(request, template, context)


# What the dashboard's socket sends instead of a body too large for a frame.
TOO_LARGE_NOTICE = (
    '<p id="dashboard-status" role="status" aria-live="polite" hx-swap-oob="true">'
    "The dashboard is too large to update live: reload the page to see it.</p>"
)


def dashboard_fragment(user: Any, page_number: Any) -> str:
    """The body partial as the page's socket sends it (an out-of-band swap).
    The session list follows the same socket: its page asks for `list-N`."""
    if isinstance(page_number, str) and page_number.startswith(LIST_PAGE_PREFIX):
        return list_fragment(user, page_number.removeprefix(LIST_PAGE_PREFIX))
    context = {**dashboard_context(user, page_number), "oob": True}
    return render_to_string("dashboard/index.html#body", context)


# ---------------------------------------------------------------- compact


@login_required
@require_POST
def compact(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """POST /sessions/<id>/compact/ (can_drive). htmx gets a status fragment;
    a plain form post gets a flash message and a redirect back."""
    ok, text = compact_outcome(request.user, session_id)
    if getattr(request, "htmx", False):
        return render(request, "dashboard/compact_result.html", {"ok": ok, "text": text})
    (messages.success if ok else messages.error)(request, text)
    back = request.POST.get("next") or request.META.get("HTTP_REFERER") or ""
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        back = reverse("sessions:chat", args=[session_id])
    return HttpResponseRedirect(back)
