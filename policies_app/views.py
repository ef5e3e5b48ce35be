"""The per-session policy editor at /sessions/<id>/policy/.

Anyone who may view the session sees its patterns and their history; only
its owner and staff may change them (the floor's rule: actions.session_for with "drive").
It also lists the tools a reviewer allowed to run without asking for the
rest of the session, each with "Ask again" (owner, staff, reviewers).
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from approvals_app.selectors import waived_tools
from policies_app.patterns import MAX_PATTERNS, parse_lines
from policies_app.selectors import current_policy, history
from sessions_app import actions
from sessions_app.actions import session_for
from sessions_app.errors import InvalidPattern, NotAllowed, TerretError, UnknownSession
from sessions_app.models import Session

TEMPLATE = "policies/editor.html"
MAX_EDITOR_CHARS = 50_000


@login_required
@require_http_methods(["GET", "POST"])
def editor(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    session = session_for(request.user, session_id, "view")
    if request.method == "GET":
        return _render(request, session)
    if "ask_again" in request.POST:
        return _ask_again(request, session)
    text = request.POST.get("patterns", "")
    error = ""
    try:
        if len(text) > MAX_EDITOR_CHARS:
            raise InvalidPattern(f"the policy text is longer than {MAX_EDITOR_CHARS} characters")
        actions.set_policy(request.user, session.id, parse_lines(text))
    except UnknownSession:
        raise Http404("no such session") from None
    except NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except TerretError as exc:
        error = str(exc)
    htmx = bool(getattr(request, "htmx", False))
    if error:
        # htmx swaps only 2xx responses; without JS the 400 page shows the error.
        return _render(request, session, text=text, error=error, status=200 if htmx else 400, fragment=htmx)
    if htmx:
        return _render(request, session, notice="Policy saved; it applies from the next tool call.", fragment=True)
    messages.success(request, "Policy saved; it applies from the next tool call.")
    return redirect("policies:editor", session_id=session.id)


def _ask_again(request: HttpRequest, session: Session) -> HttpResponse:
    """A waived tool asks for approval again (policies_app.services.ask_again)."""
    error = ""
    try:
        actions.ask_again(request.user, session.id, request.POST.get("ask_again", ""))
    except UnknownSession:
        raise Http404("no such session") from None
    except NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except TerretError as exc:
        error = str(exc)
    htmx = bool(getattr(request, "htmx", False))
    notice = "" if error else "That tool asks for approval again from its next call."
    if htmx or error:
        return _render(request, session, error=error, notice=notice, status=200 if htmx else 400, fragment=htmx)
    messages.success(request, notice)
    return redirect("policies:editor", session_id=session.id)


def _render(
    request: HttpRequest,
    session: Session,
    *,
    text: str | None = None,
    error: str = "",
    notice: str = "",
    status: int = 200,
    fragment: bool = False,
) -> HttpResponse:
    policy = current_policy(session.id, session.profile)
    ctx = {
        "session": session,
        "policy": policy,
        "floor": list(session.profile.allow_floor) if session.profile else [],
        "text": "\n".join(policy.patterns) if text is None else text,
        "history": history(session.id),
        "can_edit": actions.allowed(request.user, session, "drive"),
        "waived": waived_tools(session.id, policy.seq) if policy.source == "session" else [],
        "can_unwaive": actions.allowed(request.user, session, "drive")
        or actions.allowed(request.user, session, "approve"),
        "error": error,
        "notice": notice,
        "max_patterns": MAX_PATTERNS,
    }
    name = TEMPLATE + "#editor" if fragment else TEMPLATE
    response = render(request, name, ctx, status=status)
    if error:
        response["X-Terret-Error"] = "invalid_pattern"
    return response
