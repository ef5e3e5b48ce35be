"""The operators' console (/ops/): what needs a human, by kind, with the
buttons that act on it, a form to suspend a scope, and the operators' log.

Staff only (actions.operator, the one access rule): anyone else signed in
gets 403, the anonymous the login page. Every button is a plain POST (CSRF as everywhere)
to a view here that calls services/operators.py and redirects back with a
message; the page itself only reads (operators.attention, OperatorAction).
"""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from sessions_app import actions
from sessions_app.actions import session_for
from sessions_app.errors import NotAllowed, TerretError, UnknownSession
from sessions_app.models import AgentProfile, OperatorAction
from sessions_app.services import operators
from sessions_app.web.schedules import due_soon

RECENT_ACTIONS = 20

# (kind in operators.attention, heading, what the section is for)
SECTIONS = [
    ("blocked", "Blocked", "Turns that stopped retrying by themselves."),
    ("suspended", "Suspended", "Sessions and scopes whose admission an operator suspended."),
    ("revoked", "Revoked", "Sessions that take no input until restored."),
    ("held_input", "Held input", "Input kept back (a budget or a suspension)."),
    ("approvals", "Parked approvals", "Calls waiting for a reviewer, oldest first."),
    ("expired_leases", "Expired leases", "Open turns no live worker holds."),
    (
        "unknown_effects",
        "Effects of unknown outcome",
        "Attempts waiting for an operator's answer, of open and ended turns alike.",
    ),
    (
        "effects_audit",
        "Effect audit findings",
        "What the sweep's audit of recently active sessions' effect ledgers found.",
    ),
    ("stalled", "Stalled", "Running turns with no progress (no event, no streamed text) for a while."),
    ("notifications", "Notifications not sent", "Attempts ran out, or a send of unknown outcome."),
    (
        "stranded",
        "Stranded by a deploy",
        "Blocked on a missing definition or an event version no live worker reads, or pinned to a version "
        "whose tools the code no longer has: upgrade them (the pre-flight decides) or abandon the turn.",
    ),
    ("tasks_orphaned", "Orphaned tasks", "Live tasks whose owner is gone or ended, or whose supervisor died."),
    ("tasks_blocked", "Blocked tasks", "Tasks whose kind or version the running code lacks (never dropped)."),
    ("tasks_live", "Live tasks", "Owned work running, waiting or pending: commands and subagents, oldest first."),
]


class ScopeForm(forms.Form):
    scope = forms.ChoiceField(choices=[(s, s) for s in operators.SCOPES])
    target = forms.CharField(max_length=64, required=False, strip=True)
    reason = forms.CharField(max_length=operators.MAX_REASON_CHARS, required=False)


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=operators.MAX_REASON_CHARS, required=False)


def _form_errors(form: forms.Form) -> str:
    return " ".join(str(e) for errors in form.errors.values() for e in errors)


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    found = actions.attention(request.user).items
    sections = [
        {"kind": kind, "heading": heading, "about": about, "items": found.get(kind, [])}
        for kind, heading, about in SECTIONS
    ]
    return render(
        request,
        "console/index.html",
        {
            "sections": sections,
            "total": sum(len(s["items"]) for s in sections),
            "recent": OperatorAction.objects.order_by("-at")[:RECENT_ACTIONS],
            "profiles": AgentProfile.objects.order_by("name").values_list("name", flat=True)[:200],
            "scopes": operators.SCOPES,
            "schedules": due_soon(),
        },
    )


def _scope_action(request: HttpRequest, action: str) -> HttpResponse:
    # The one rule before the form is judged, as on every door.
    actions.operator(request.user)
    form = ScopeForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Nothing done: {_form_errors(form)}")
        return redirect("sessions:console")
    data = form.cleaned_data
    what = data["scope"] if data["scope"] == "global" else f"{data['scope']} {data['target']}"
    try:
        if action == "suspend":
            actions.suspend(request.user, data["scope"], data["target"], data["reason"])
            messages.success(request, f"Suspended admission: {what}.")
        else:
            woken = actions.resume(request.user, data["scope"], data["target"], data["reason"]).woken
            messages.success(request, f"Resumed admission: {what} ({woken} session(s) woken).")
    except TerretError as exc:
        messages.error(request, f"Nothing done: {exc}")
    return redirect("sessions:console")


@login_required
@require_POST
def suspend(request: HttpRequest) -> HttpResponse:
    return _scope_action(request, "suspend")


@login_required
@require_POST
def resume(request: HttpRequest) -> HttpResponse:
    return _scope_action(request, "resume")


# What each session action (actions.SESSION_ACTIONS) did, as the flash says it.
SESSION_ACTIONS: dict[str, str] = {
    "retry": "Retrying the turn of",
    "abandon": "Abandoned the blocked turn of",
    "revoke": "Revoked",
    "restore": "Restored",
    "upgrade": "Upgraded to the newest version",
}


@login_required
@require_POST
def session_action(request: HttpRequest, session_id: uuid.UUID, action: str) -> HttpResponse:
    # The one rule before the form is judged (a foreign or missing id: 404, as on every door).
    session_for(request.user, session_id, "operate")
    if action not in SESSION_ACTIONS:
        raise Http404("no such action")
    form = ReasonForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Nothing done: {_form_errors(form)}")
        return redirect("sessions:console")
    try:
        if action == "upgrade":  # agent versions' verb (pre-flight; 409 upgrade_refused): to the newest
            actions.upgrade(request.user, session_id, None)
        else:
            actions.session_action(request.user, session_id, action, form.cleaned_data["reason"])
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:
        messages.error(request, f"Nothing done: {exc}")
    else:
        messages.success(request, f"{SESSION_ACTIONS[action]} session {session_id}.")
    return redirect("sessions:console")
