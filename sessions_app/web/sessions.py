"""Web pages: login-protected session list, new session, and the chat page.

Views stay thin: reads are bounded queries (a page of events at a time), and
every write is the same verb the other doors call (`actions.<verb>(user,
session_id, ...)`), which asks the one access rule (`actions.session_for`)
before it writes; web/errors.py turns its refusals into pages. A view that
judges a form first asks the rule itself before the form, so a refusal
answers the same whatever was posted. Another
user's session is a 404, not a 403, so ids do not leak.

The chat page is fully server-rendered (it works without JavaScript); htmx's
ws extension then follows the log over the page's socket from the last seq
the page rendered, and the socket sends each later event as the same
template's partial (web/present.py). htmx requests get partials of the same
template (`sessions/chat.html#earlier` etc.).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from approvals_app.selectors import pending as pending_calls
from sessions_app import actions
from sessions_app.actions import session_for
from sessions_app.errors import NotAllowed, NotBlocked, TerretError, UnknownSession
from sessions_app.live.paths import socket_url
from sessions_app.models import Agent, Session
from sessions_app.services import MAX_INPUT_CHARS
from sessions_app.web.context import context_view
from sessions_app.web.forms import BudgetForm, MessageForm, NewSessionForm, ResolveForm
from sessions_app.web.listing import list_context
from sessions_app.web.present import (
    EventRow,
    budget_context,
    effects_context,
    event_row,
    facts_context,
    with_cards,
    with_holds,
    with_origins,
)

# What an empty chat offers to type (the demo model's keywords, README "Try it").
SUGGESTIONS = (
    "What time is it?",
    "List the files in the workspace",
    "write notes.txt: remember the milk",
    "Hello! Echo this in **Markdown**",
)
# Events per page of the chat log; "load earlier" fetches the page before.
PAGE_SIZE = 200
LIST_PAGE_SIZE = 50


# ------------------------------------------------------------------ helpers


def _event_rows(session: Session, *, before: int | None, upto: int) -> list[EventRow]:
    """A bounded page: the PAGE_SIZE events before `before` (or up to `upto`)."""
    rows = actions.chat_rows(session, before=before, upto=upto, limit=PAGE_SIZE)
    cursor = getattr(session, "deferred_cursor", 0)
    shown = [event_row(seq, kind, data, at, session.inbox_seq, cursor) for seq, kind, data, at in rows]
    return with_origins(session.id, with_holds(with_cards(session.id, shown)))


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
    return {
        **facts_context(session, request.user),
        **effects_context(session, request.user),
        **budget_context(session, request.user),
        "agent_id": _agent_id(session),
        "events": events,
        "older_before": first if first is not None and first > 1 else None,
        "newer_before": newer,
        "live": live,
        "last_seq": upto if live else last_shown,
        "socket_url": socket_url("chat", session_id=session.id),
        "pending": pending,
        "approvals_next": url,
        "form": form or MessageForm(),
        "chat_url": url,
        "empty_chat": not session.turns and not session.last_input_seq,
        # The session's live tasks (owned work: runtime/owned/), as of the page's load.
        "live_tasks": [actions.task_json(t) for t in actions.list_tasks(request.user, session.id) if t.live],
        "parent": actions.session_parent(session),
        **composer_context(),
    }


def composer_context() -> dict[str, Any]:
    return {"max_chars": MAX_INPUT_CHARS, "max_chars_text": f"{MAX_INPUT_CHARS:,}", "suggestions": SUGGESTIONS}


# ------------------------------------------------------------------ pages


@login_required
@require_GET
def session_list(request: HttpRequest) -> HttpResponse:
    """The sessions: search by title (?q=), the archive (?archived=1), 50 a page."""
    context = list_context(
        request.user,
        request.GET.get("page"),
        query=request.GET.get("q", ""),
        archived=request.GET.get("archived") == "1",
    )
    if getattr(request, "htmx", False) and request.GET.get("fragment") == "body":
        return render(request, "sessions/list.html#body", context)
    return render(request, "sessions/list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def session_new(request: HttpRequest) -> HttpResponse:
    form = NewSessionForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        user = request.user  # the verb takes the user, as on every door
        try:
            made = actions.create_session(user, form.cleaned_data["profile"].name)
        except TerretError as exc:
            form.add_error(None, str(exc))
        else:
            return redirect("sessions:chat", session_id=made.id)
    status = 400 if request.method == "POST" else 200
    return render(request, "sessions/new.html", {"form": form}, status=status)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def session_chat(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    session = session_for(request.user, session_id, "view")
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
    return _no_store(render(request, "sessions/chat.html", ctx))


def _no_store(response: HttpResponse) -> HttpResponse:
    """Back and Forward must not bring the page back from a cache: its
    composer's idempotency key has been used by then, and every send would
    replay (the page also renews the key on pageshow, terret-live.js)."""
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def session_message(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Send a message: it wakes an idle agent, or becomes a steer that rides
    the running turn's next step (shown as queued until it lands)."""
    session = session_for(request.user, session_id, "drive")
    htmx = bool(getattr(request, "htmx", False))
    form = MessageForm(request.POST)
    notice = ""
    refused: TerretError | None = None
    if form.is_valid():
        try:
            receipt = actions.inject(
                request.user,
                session.id,
                form.cleaned_data["text"],
                wake=True,
                idempotency_key=form.cleaned_data["key"] or None,
                lane=form.cleaned_data["lane"] or None,
            )
        except (UnknownSession, NotAllowed):
            raise
        except TerretError as exc:
            form.add_error(None, str(exc))
            refused = exc
        else:
            if receipt.disposition == "queued" and form.cleaned_data["lane"] == "follow_up":
                notice = "Queued: your message is sent as a new turn when this one ends."
            elif receipt.disposition == "queued":
                notice = "Queued: your message rides the agent's next step."
            elif receipt.disposition == "held":
                notice = f"Held: {receipt.held_reason}. It runs once the budget allows."
            if not htmx:
                if notice:
                    messages.info(request, notice)
                return HttpResponseRedirect(f"{reverse('sessions:chat', args=[session.id])}#composer")
            ctx = {"session": session, "form": MessageForm(), "notice": notice, "refocus": True, **composer_context()}
            return render(request, "sessions/chat.html#composer", ctx)
    if htmx:
        # 200, so htmx swaps the form in with its error (it does not swap a
        # 4xx); X-Terret-Error says it was refused. The text stays as typed.
        ctx = {"session": session, "form": form, "refocus": True, **composer_context()}
        response = render(request, "sessions/chat.html#composer", ctx)
        response["X-Terret-Error"] = refused.code if refused is not None else "invalid_input"
        return response
    ctx = _chat_context(request, session, form=form)
    ctx["refocus"] = True
    # The refusal's own status (409 inbox_full, 409 turn_already_running), as the API answers it.
    status = refused.status if refused is not None else 400
    return _no_store(render(request, "sessions/chat.html", ctx, status=status))


@login_required
@require_POST
def session_cancel(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    cancelled = actions.cancel(request.user, session_id).cancelled
    if getattr(request, "htmx", False):
        # The status badge follows the log over the websocket.
        return HttpResponse(status=204)
    if cancelled:
        messages.info(request, "Stopped: the turn ends within a second, keeping what was streamed.")
    else:
        messages.info(request, "Nothing to stop: the agent is idle.")
    return redirect("sessions:chat", session_id=session_id)


@login_required
@require_POST
def task_cancel(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    """A task card's Cancel: abort intent now, the cancelled receipt follows."""
    task = actions.cancel_task(request.user, task_id)
    if getattr(request, "htmx", False):
        return HttpResponse(status=204)  # the card follows the log over the websocket
    messages.info(request, "Cancelling the task: its process group is stopped within a second.")
    return redirect("sessions:chat", session_id=task.session_id)


@login_required
@require_POST
def session_retry(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Drive a blocked turn again now (the Retry button of a blocked session)."""
    htmx = bool(getattr(request, "htmx", False))
    try:
        actions.retry(request.user, session_id)
    except NotBlocked:
        if htmx:
            return HttpResponse("Nothing to retry: the turn is not blocked.", status=409)
        messages.info(request, "Nothing to retry: the turn is not blocked.")
    else:
        if htmx:
            return HttpResponse(status=204)  # the header follows the log over the websocket
        messages.info(request, "Retrying the turn now.")
    return redirect("sessions:chat", session_id=session_id)


RESOLVED_NOTICES = {
    "rerun": "Running the call again.",
    "done": "Recorded as done.",
    "failed": "Recorded as failed.",
}


@login_required
@require_POST
def session_resolve(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """An operator's answer to an attempt of unknown outcome (the buttons of
    the page's notice): re-run it, or record it done or failed. Staff, and
    the owner when TERRET_OWNER_MAY_RESOLVE is on; 403 for anyone else who
    may read the session. htmx gets the notice re-rendered with what
    happened (status 200, so it swaps; `X-Terret-Error` carries an error's
    code); a plain POST redirects back with a message."""
    session = session_for(request.user, session_id, "resolve")
    form = ResolveForm(request.POST)
    notice = error = code = ""
    if not form.is_valid():
        error, code = " ".join(str(e) for errors in form.errors.values() for e in errors), "invalid_input"
    else:
        data = form.cleaned_data
        try:
            actions.resolve(request.user, session.id, data["call_id"], data["action"], data["result"], data["reason"])
        except (UnknownSession, NotAllowed):
            raise
        except TerretError as exc:
            error, code = str(exc), exc.code
        else:
            notice = RESOLVED_NOTICES[data["action"]]

    def fragment() -> HttpResponse:
        fresh = Session.objects.filter(id=session.id).first() or session
        context = effects_context(fresh, request.user, notice=notice, error=error)
        return render(request, "sessions/chat.html#effects", context)

    return _answer(request, session, fragment, notice=notice, error=error, code=code)


@login_required
@require_POST
def session_budget(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Set the session's four limits (the budget panel's form; blank: no
    limit). The owner or staff; 403 for anyone else who may read the
    session. htmx gets the panel re-rendered with what happened (status
    200, so it swaps; `X-Terret-Error` carries an error's code); a plain
    POST redirects back with a message."""
    session = session_for(request.user, session_id, "drive")
    form = BudgetForm(request.POST)
    notice = error = code = ""
    if not form.is_valid():
        error, code = " ".join(str(e) for errors in form.errors.values() for e in errors), "invalid_input"
    else:
        try:
            actions.set_budget(request.user, session.id, form.limits())
        except (UnknownSession, NotAllowed):
            raise
        except TerretError as exc:
            error, code = str(exc), exc.code
        else:
            notice = "Budget saved."

    def fragment() -> HttpResponse:
        context = budget_context(session, request.user, notice=notice, error=error, form=form if error else None)
        return render(request, "sessions/chat.html#budget", context)

    return _answer(request, session, fragment, notice=notice, error=error, code=code)


def _answer(
    request: HttpRequest, session: Session, fragment: Callable[[], HttpResponse], *, notice: str, error: str, code: str
) -> HttpResponse:
    """What a panel's form post answers: htmx gets the panel re-rendered
    (status 200, so it swaps; `X-Terret-Error` carries an error's code), a
    plain POST a redirect back to the chat with the message."""
    if getattr(request, "htmx", False):
        response = fragment()
        if code:
            response["X-Terret-Error"] = code
        return response
    if error:
        messages.error(request, error)
    else:
        messages.info(request, notice)
    return redirect("sessions:chat", session_id=session.id)


# ------------------------------------------------------------------ rename, archive


@login_required
@require_POST
def session_rename(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """A new title by the user (a session/titled: the latest wins). htmx gets
    the header's manage block with what happened (200, so it swaps); the
    title itself follows over the socket. A plain POST redirects back."""
    session = session_for(request.user, session_id, "drive")
    title = request.POST.get("title", "")
    notice = error = code = ""
    try:
        actions.rename(request.user, session.id, title)
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:
        error, code = str(exc), exc.code
    else:
        notice = "Renamed."
    if getattr(request, "htmx", False):
        fresh = Session.objects.get(id=session.id)
        context = {
            "session": fresh,
            "rename_notice": notice,
            "rename_error": error,
            "rename_value": title if error else "",
        }
        response = render(request, "sessions/chat.html#manage", context)
        if error:
            response["X-Terret-Error"] = code
        return response
    if error:
        messages.error(request, f"Not renamed: {error}")
    else:
        messages.info(request, notice)
    return redirect("sessions:chat", session_id=session.id)


@login_required
@require_POST
def session_archive(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Archive: hidden from the list, its agent disposed. Back to the list."""
    try:
        session = actions.archive(request.user, session_id)
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:
        messages.error(request, f"Not archived: {exc}")
        return redirect("sessions:chat", session_id=session_id)
    messages.info(request, f"Archived “{session.title or 'Untitled session'}”. It is listed under Archived.")
    return redirect("sessions:list")


@login_required
@require_POST
def session_unarchive(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    session = actions.unarchive(request.user, session_id)
    messages.info(request, "Unarchived: the session is back in the list.")
    return redirect("sessions:chat", session_id=session.id)


# ------------------------------------------------------------------ the context view


@login_required
@require_GET
def session_context(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """What the model sees next, and the model picker (for those who may drive)."""
    session = session_for(request.user, session_id, "view")
    if getattr(request, "htmx", False) and request.GET.get("fragment") == "panel":
        return render(request, "sessions/context.html#panel", _context_page(request, session))
    return render(request, "sessions/context.html", _context_page(request, session))


def _context_page(request: HttpRequest, session: Session, **extra: Any) -> dict[str, Any]:
    return {
        "session": session,
        "can_drive": actions.allowed(request.user, session, "drive"),
        "chat_url": reverse("sessions:chat", args=[session.id]),
        **context_view(session),
        **extra,
    }


@login_required
@require_POST
def session_model(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """The model picker: repoint the main role (model/updated), from the next step."""
    spec = request.POST.get("spec", "")
    try:
        actions.set_model(request.user, session_id, "main", spec)
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:
        fresh = session_for(request.user, session_id, "drive")
        context = _context_page(request, fresh, model_error=str(exc), model_value=spec)
        return render(request, "sessions/context.html", context, status=400)
    messages.info(request, f"Model set: the next step uses {spec.strip()}.")
    return redirect("sessions:context", session_id=session_id)
