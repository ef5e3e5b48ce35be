"""Approval pages: the reviewer's queue, the session page's inline partial,
and the verdict form both post to. Thin: who may do what is the floor's
(sessions_app.actions: session_for, reviewer), decisions its `decide` verb.

Responses: permission failures are 403 (404 when the user may not even see
the session) for every kind of request. A verdict that cannot land for a
reason a reviewer should read ("already decided", "turn closed", bad input)
re-renders the fragment with the message for htmx (status 200, so htmx
swaps it; the `X-Terret-Error` header carries the code) and redirects with a
message without JavaScript.
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from approvals_app import services
from approvals_app.selectors import queue_for
from sessions_app import actions
from sessions_app.actions import session_for
from sessions_app.errors import NotAllowed, TerretError, UnknownSession
from sessions_app.live.paths import socket_url
from sessions_app.models import Session

QUEUE_TEMPLATE = "approvals/queue.html"
INLINE_TEMPLATE = "approvals/inline.html"


def _reviewer(request: HttpRequest) -> None:
    actions.reviewer(request.user)  # the one rule: NotAllowed, the 403 page


def _queue_context(request: HttpRequest, *, notice: str = "", error: str = "") -> dict[str, object]:
    return {"queue": queue_for(request.user), "notice": notice, "error": error, "socket_url": socket_url("approvals")}


def _inline_context(session: Session, *, notice: str = "", error: str = "") -> dict[str, object]:
    # Without JS, a verdict posted from the fragment returns to the session page.
    back = reverse("sessions:chat", args=[session.id])
    return {"session": session, "pending": None, "notice": notice, "error": error, "approvals_next": back}


@login_required
@require_GET
def queue_page(request: HttpRequest) -> HttpResponse:
    _reviewer(request)
    return render(request, QUEUE_TEMPLATE, _queue_context(request))


@login_required
@require_GET
def queue_fragment(request: HttpRequest) -> HttpResponse:
    """The queue alone: what the live page refetches on every hint."""
    _reviewer(request)
    return render(request, QUEUE_TEMPLATE + "#queue", _queue_context(request))


@login_required
@require_GET
@vary_on_headers("HX-Request")
def inline_fragment(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """One session's pending approvals, as the session page includes them."""
    session = session_for(request.user, session_id, "view")
    return render(request, INLINE_TEMPLATE, _inline_context(session))


@login_required
@require_POST
def decide(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    origin = "inline" if request.POST.get("from") == "inline" else "queue"
    notice = error = code = ""
    # "approve_session": approve, and allow this tool for the rest of the session.
    verdict = request.POST.get("verdict", "")
    allow = verdict == "approve_session"
    verdict = "approve" if allow else verdict
    try:
        session_for(request.user, session_id, "approve")  # the one rule, before the shape is judged
        # The edit box is posted with every button; a denial ignores it.
        edited = services.parse_edited_args(request.POST.get("edited_args")) if verdict == "approve" else None
        decided = actions.decide(
            request.user,
            session_id,
            request.POST.get("call_id", ""),
            verdict,
            request.POST.get("reason", ""),
            request.POST.get("seq") or None,  # type: ignore[arg-type]  # the service checks the value
            edited_args=edited,
            allow_for_session=allow,
        )
    except UnknownSession:
        raise Http404("no such session") from None
    except NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except TerretError as exc:
        error, code = str(exc), exc.code
    else:
        notice = _notice(decided, allow)
    if getattr(request, "htmx", False):
        response = _fragment(request, origin, session_id, notice=notice, error=error)
        if code:
            response["X-Terret-Error"] = code
        return response
    if error:
        messages.error(request, error)
    else:
        messages.success(request, notice)
    return redirect(_next_url(request, origin))


def _notice(decided: actions.Decision, allowed: bool) -> str:
    if decided.verdict != "approve":
        return "Denied."
    notice = "Approved with your edits." if decided.edited_args is not None else "Approved."
    return notice + (" The tool no longer asks in this session." if allowed else "")


def _fragment(request: HttpRequest, origin: str, session_id: uuid.UUID, *, notice: str, error: str) -> HttpResponse:
    if origin == "inline":
        session = session_for(request.user, session_id, "view")
        return render(request, INLINE_TEMPLATE, _inline_context(session, notice=notice, error=error))
    context = {**_queue_context(request, notice=notice, error=error), "verdict": True, "notice_oob": True}
    return render(request, QUEUE_TEMPLATE + "#queue", context)


def _next_url(request: HttpRequest, origin: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure()):
        return target
    return reverse("approvals:queue")
