"""Web pages: login-protected session list, new session, and the chat page.

Views stay thin: reads are bounded queries (a page of events at a time), writes
go through `services`, and every view asks `permissions` first. Another user's
session is a 404, not a 403, so ids do not leak.

The chat page is fully server-rendered (it works without JavaScript); the live
client (static/js/terret-live.js) then follows the log over the session
websocket from the last seq the page rendered. htmx requests get partials of
the same template (`sessions/chat.html#earlier` etc.).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import F
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.template import TemplateDoesNotExist
from django.template.loader import get_template
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from approvals_app.selectors import PendingCall
from approvals_app.selectors import pending as pending_calls
from sessions_app import permissions, services
from sessions_app.errors import TerretError
from sessions_app.models import Agent, Event, Session
from sessions_app.web.forms import MessageForm, NewSessionForm

# Events per page of the chat log; "load earlier" fetches the page before.
PAGE_SIZE = 200
LIST_PAGE_SIZE = 50
APPROVALS_TEMPLATE = "approvals/inline.html"

# Kinds that are bookkeeping rather than conversation: rendered (so every seq
# has exactly one element) but hidden unless "show all events" is ticked.
META_KINDS = frozenset(
    {
        "turn/start",
        "step/start",
        "step/end",
        "usage/recorded",
        "session/titled",
        "policy/updated",
        "model/updated",
        "agent/spawned",
        "agent/disposed",
    }
)
STATUS_LABELS = {"idle": "idle", "running": "running", "waiting_approval": "waiting for approval"}


# ------------------------------------------------------------------ helpers


def format_cost(cost: Decimal | float, unpriced: int) -> str:
    """The running cost; entries the provider did not price are counted, never
    shown as $0. terret-live.js formats the same way."""
    text = f"${Decimal(cost):.4f}"
    if unpriced:
        text += f" + {unpriced} unpriced"
    return text


def _pretty(raw: Any) -> str:
    """Tool arguments as indented JSON (they arrive as a JSON string)."""
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return raw
    return json.dumps(value, indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class EventRow:
    """One event as the templates render it. Mirrors renderEvent() in terret-live.js."""

    seq: int
    kind: str
    data: dict[str, Any]
    at: Any
    queued: bool = False

    @property
    def slug(self) -> str:
        return self.kind.replace("/", "-")

    @property
    def meta(self) -> bool:
        # A queued input that has landed shows up again as the context it
        # became; its own row turns into bookkeeping.
        return self.kind in META_KINDS or (self.kind == "input/queued" and not self.queued)

    @property
    def tool_calls(self) -> list[dict[str, str]]:
        calls = self.data.get("tool_calls") or []
        return [{"id": c["id"], "name": c["name"], "args": _pretty(c.get("arguments", ""))} for c in calls]

    @property
    def args_json(self) -> str:
        return _pretty(self.data.get("args", {}))

    @property
    def data_json(self) -> str:
        return json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))


def _event_rows(session: Session, *, before: int | None, upto: int) -> list[EventRow]:
    """A bounded page: the PAGE_SIZE events before `before` (or up to `upto`)."""
    qs = Event.objects.filter(session_id=session.id)
    qs = qs.filter(seq__lt=before) if before is not None else qs.filter(seq__lte=upto)
    rows = list(qs.order_by("-seq").values_list("seq", "kind", "data", "created_at")[:PAGE_SIZE])
    rows.reverse()
    return [
        EventRow(seq, kind, data, at, queued=(kind == "input/queued" and seq > session.inbox_seq))
        for seq, kind, data, at in rows
    ]


@cache
def _approvals_template() -> str | None:
    """The approvals engineer's inline partial, when it is installed."""
    try:
        get_template(APPROVALS_TEMPLATE)
    except TemplateDoesNotExist:
        return None
    return APPROVALS_TEMPLATE


def _viewable(request: HttpRequest, session_id: uuid.UUID) -> Session:
    session = get_object_or_404(Session.objects.select_related("profile", "owner", "agent"), id=session_id)
    if not permissions.can_view(request.user, session):
        raise Http404("no such session")
    return session


def _drivable(request: HttpRequest, session_id: uuid.UUID) -> Session:
    session = _viewable(request, session_id)
    if not permissions.can_drive(request.user, session):
        raise PermissionDenied("only the session's owner or staff may drive it")
    return session


def _agent_id(session: Session) -> str:
    try:
        return session.agent.agent_id
    except Agent.DoesNotExist:  # disposed: the session stays readable
        return ""


def _parse_seq(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError("must be a positive integer")
    return int(raw)


def _pending_view(pending: list[PendingCall]) -> list[dict[str, Any]]:
    return [{"call_id": p.call_id, "name": p.name, "args": _pretty(p.args), "seq": p.seq} for p in pending]


def _chat_context(
    request: HttpRequest, session: Session, *, before: int | None = None, form: MessageForm | None = None
) -> dict[str, Any]:
    # The session row is read first: its projections describe the log exactly
    # up to last_seq, so the page below is rendered up to that seq and the
    # live client continues from it with nothing missed or doubled.
    upto = session.last_seq
    events = _event_rows(session, before=before, upto=upto)
    pending = pending_calls(session.id) if session.open_turn_seq is not None else []
    first = events[0].seq if events else None
    last_shown = events[-1].seq if events else 0
    live = before is None
    newer: int | None = None
    if not live and last_shown + PAGE_SIZE < upto:
        newer = last_shown + PAGE_SIZE + 1
    url = reverse("sessions:chat", args=[session.id])
    state = {
        "session": str(session.id),
        "last_seq": upto if live else last_shown,
        "open_turn": session.open_turn_seq,
        "pending": [p.call_id for p in pending],
        "cost": float(session.cost),
        "unpriced": session.unpriced_entries,
        "title": session.title,
        "ws_path": f"/ws/sessions/{session.id}/",
        "page_url": url,
        "live": live,
    }
    return {
        "session": session,
        "agent_id": _agent_id(session),
        "status_label": STATUS_LABELS.get(session.status, session.status),
        "cost_text": format_cost(session.cost, session.unpriced_entries),
        "events": events,
        "older_before": first if first is not None and first > 1 else None,
        "newer_before": newer,
        "live": live,
        "pending": pending,
        "pending_view": _pending_view(pending),
        "approvals_template": _approvals_template(),
        "can_drive": permissions.can_drive(request.user, session),
        "can_approve": permissions.can_approve(request.user, session),
        "form": form or MessageForm(),
        "live_state": state,
        "chat_url": url,
    }


# ------------------------------------------------------------------ pages


@login_required
@require_GET
def session_list(request: HttpRequest) -> HttpResponse:
    qs = permissions.visible_sessions(request.user, Session.objects.all())
    qs = qs.select_related("profile", "owner", "agent").order_by(
        F("last_event_at").desc(nulls_last=True), "-created_at"
    )
    page = Paginator(qs, LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [
        {
            "session": s,
            "agent_id": _agent_id(s),
            "status_label": STATUS_LABELS.get(s.status, s.status),
            "cost_text": format_cost(s.cost, s.unpriced_entries),
        }
        for s in page.object_list
    ]
    show_owner = bool(request.user.is_staff or permissions.is_reviewer(request.user))  # type: ignore[union-attr]
    return render(request, "sessions/list.html", {"page": page, "rows": rows, "show_owner": show_owner})


@login_required
@require_http_methods(["GET", "POST"])
def session_new(request: HttpRequest) -> HttpResponse:
    form = NewSessionForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            session = services.create_session(request.user, form.cleaned_data["profile"])
        except TerretError as exc:
            form.add_error(None, str(exc))
        else:
            return redirect("sessions:chat", session_id=session.id)
    status = 400 if request.method == "POST" else 200
    return render(request, "sessions/new.html", {"form": form}, status=status)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def session_chat(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    session = _viewable(request, session_id)
    try:
        before = _parse_seq(request.GET.get("before"))
    except ValueError:
        return HttpResponseBadRequest("before must be a positive integer (an event seq)")
    ctx = _chat_context(request, session, before=before)
    fragment = request.GET.get("fragment")
    if fragment == "approvals":
        return render(request, "sessions/chat.html#approvals", ctx)
    if fragment is not None:
        return HttpResponseBadRequest("unknown fragment")
    if before is not None and getattr(request, "htmx", False):
        # "Load earlier": the older page plus the link to the one before it.
        return render(request, "sessions/chat.html#earlier", ctx)
    return render(request, "sessions/chat.html", ctx)


@login_required
@require_POST
def session_message(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Send a message: it wakes an idle agent, or becomes a steer that rides
    the running turn's next step (shown as queued until it lands)."""
    session = _drivable(request, session_id)
    htmx = bool(getattr(request, "htmx", False))
    form = MessageForm(request.POST)
    notice = ""
    if form.is_valid():
        try:
            receipt = services.inject(
                session.id,
                form.cleaned_data["text"],
                wake=True,
                by=request.user.get_username(),
                idempotency_key=form.cleaned_data["key"] or None,
            )
        except TerretError as exc:
            form.add_error(None, str(exc))
        else:
            if receipt.disposition == "queued":
                notice = "Queued: your message rides the agent's next step."
            if not htmx:
                if notice:
                    messages.info(request, notice)
                return HttpResponseRedirect(f"{reverse('sessions:chat', args=[session.id])}#composer")
            ctx = {"session": session, "form": MessageForm(), "notice": notice, "refocus": True}
            return render(request, "sessions/chat.html#composer", ctx)
    if htmx:
        ctx = {"session": session, "form": form, "refocus": True}
        return render(request, "sessions/chat.html#composer", ctx, status=400)
    ctx = _chat_context(request, session, form=form)
    ctx["refocus"] = True
    return render(request, "sessions/chat.html", ctx, status=400)


@login_required
@require_POST
def session_cancel(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    session = _drivable(request, session_id)
    cancelled = services.cancel(session.id, by=request.user.get_username())
    if getattr(request, "htmx", False):
        # The status badge follows the log over the websocket.
        return HttpResponse(status=204)
    if cancelled:
        messages.info(request, "Cancel requested: the turn stops at its next step boundary.")
    else:
        messages.info(request, "Nothing to cancel: the agent is idle.")
    return redirect("sessions:chat", session_id=session.id)
