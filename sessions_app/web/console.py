"""The operators' console (/ops/), a live fleet view: the turns running
now, what needs a human, by kind, with the buttons that act on it, the
session table (status filters, sorting), a form to suspend a scope, and the
operators' log; and a session's timeline (/ops/sessions/<id>/timeline/).

Staff only (actions.operator, the one access rule): anyone else signed in
gets 403, the anonymous the login page. Every button is a plain POST (CSRF as everywhere)
to a view here that calls an actions verb and redirects back with a
message; approvals and held input are also decided in place (htmx: the
answer is the console's body as an out-of-band swap, no reload). The page
follows its socket (web/console_socket.py) as the dashboard does.
"""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_POST

from sessions_app import actions
from sessions_app.actions import session_for
from sessions_app.actions.words import status_label
from sessions_app.errors import NotAllowed, TerretError, UnknownSession
from sessions_app.live.paths import socket_url
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
        "monitors",
        "Monitors",
        "A source partition whose last scan was failed or partial, an edition of unknown outcome (its send is "
        "among the effects of unknown outcome above: an email waits for an operator's answer, POST "
        "/api/sessions/{id}/effects/edition-{edition}/resolve), a held edition.",
    ),
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


def console_context(user: Any, status: str, sort: str) -> dict[str, Any]:
    """Everything the console's body shows, for the page and its socket alike."""
    found = actions.attention(user).items
    sections = [
        {"kind": kind, "heading": heading, "about": about, "items": found.get(kind, [])}
        for kind, heading, about in SECTIONS
    ]
    fleet = actions.fleet(user, status, sort)
    return {
        "sections": sections,
        "total": sum(len(s["items"]) for s in sections),
        "fleet": fleet,
        "recent": OperatorAction.objects.order_by("-at")[:RECENT_ACTIONS],
        "schedules": due_soon(),
    }


def console_fragment(user: Any, status: str, sort: str, csrf_token: str = "") -> str:
    """The body partial as an out-of-band swap (the socket's frames, the in-place buttons' answers).
    `csrf_token`: the socket's own (its CSRF cookie), so the plain forms in a live body still post."""
    context = {**console_context(user, status, sort), "oob": True, "csrf_token": csrf_token, "user": user}
    return render_to_string("console/index.html#body", context)


def _view_args(request: HttpRequest) -> tuple[str, str]:
    return str(request.GET.get("status", "all"))[:32], str(request.GET.get("sort", "recent"))[:32]


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    status, sort = _view_args(request)
    context = console_context(request.user, status, sort)
    fleet = context["fleet"]
    return render(
        request,
        "console/index.html",
        {
            **context,
            "profiles": AgentProfile.objects.order_by("name").values_list("name", flat=True)[:200],
            "scopes": operators.SCOPES,
            "socket_url": f"{socket_url('console')}?status={fleet.status}&sort={fleet.sort}",
        },
    )


def _in_place(request: HttpRequest, ok: bool, text: str) -> HttpResponse:
    """htmx: the outcome as the new #ops-status (the target: it stays in the page while a socket frame may
    have replaced the form that asked) and the console's body again, out of band; else a flash and back."""
    if getattr(request, "htmx", False):
        status, sort = str(request.POST.get("status", "all")), str(request.POST.get("sort", "recent"))
        body = console_fragment(request.user, status, sort, str(request.META.get("CSRF_COOKIE", "")))
        line = format_html(
            '<p id="ops-status" class="{}" role="status" aria-live="polite">{}</p>',
            "ok" if ok else "error",
            text,
        )
        return HttpResponse(line + body)
    (messages.success if ok else messages.error)(request, text)
    return redirect("sessions:console")


@login_required
@require_POST
def decide(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Approve or deny a parked call in place, through the reviewers' decide verb."""
    session_for(request.user, session_id, "operate")  # staff first: a foreign or missing id is a 404
    verdict = str(request.POST.get("verdict", ""))
    call_id = str(request.POST.get("call_id", ""))
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return _in_place(request, False, f"Nothing done: {_form_errors(form)}")
    try:
        decision = actions.decide_approval(request.user, session_id, call_id, verdict, form.cleaned_data["reason"])
    except UnknownSession:
        raise
    except (NotAllowed, TerretError) as exc:
        return _in_place(request, False, f"Nothing done: {exc}")
    said = "Approved" if decision.verdict == "approve" else "Denied"
    return _in_place(request, True, f"{said} {call_id} of session {session_id}.")


@login_required
@require_GET
def timeline(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """A session's events as a compact history, each row expandable to its JSON (operators)."""
    try:
        after = max(0, int(request.GET.get("after", "0")))
    except ValueError:
        after = 0
    found = actions.timeline(request.user, session_id, after)
    return render(
        request,
        "console/timeline.html",
        {
            "timeline": found,
            "session": found.session,
            "status_label": status_label(found.session.status),
            "chat_url": reverse("sessions:chat", args=[session_id]),
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
    "free": "Freed the held input of",
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
    done = ""
    try:
        if action == "upgrade":  # agent versions' verb (pre-flight; 409 upgrade_refused): to the newest
            actions.upgrade(request.user, session_id, None)
        elif action == "free":  # in place too: the held input's own suspension or budget lifted
            done = f" ({actions.free_held(request.user, session_id, form.cleaned_data['reason'])})"
        else:
            actions.session_action(request.user, session_id, action, form.cleaned_data["reason"])
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:
        return _in_place(request, False, f"Nothing done: {exc}")
    return _in_place(request, True, f"{SESSION_ACTIONS[action]} session {session_id}{done}.")
