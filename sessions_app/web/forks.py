"""The chat page's forks: edit-and-resend and regenerate on a message, the
breadcrumb back to a fork's parent, and "forked here →" markers.

The chat template includes `sessions/_fork_actions.html`, which loads the
panel (`fork_panel`, below) into the page's header; static/js/forks.js adds
the actions to the message rows (also to rows the page's socket adds later)
and places the markers after the events they fork from. Both actions are
plain POSTs: the fork is made, and the browser is sent to its chat.

Who may fork: whoever may read the session (the fork is theirs); another
user's session is a 404 here, as everywhere.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_POST

from sessions_app import actions
from sessions_app.actions import session_for
from sessions_app.errors import TerretError, UnknownSession
from sessions_app.models import Session
from sessions_app.services import forks


def _chat(session_id: Any, seq: int | None = None) -> str:
    url = reverse("sessions:chat", args=[session_id])
    return f"{url}#ev-{seq}" if seq else url


def _seq(request: HttpRequest) -> int | None:
    try:
        value = int(request.POST.get("seq", ""))
    except ValueError:
        return None
    return value if value >= 1 else None


def panel_context(request: HttpRequest, session: Session) -> dict[str, Any]:
    """Where the session came from and where its forks went (those the user may read)."""
    origin = forks.forked_from(session.id)
    parent = None
    if origin is not None:
        found = Session.objects.filter(id=origin["parent"]).first()
        parent = found if found is not None and actions.allowed(request.user, found, "view") else None
    notes = forks.forks_of(session.id)
    children = {
        str(s.id): s for s in actions.visible(request.user, Session.objects.filter(id__in=[n["child"] for n in notes]))
    }
    marks = [{**n, "session": children[n["child"]]} for n in notes if n["child"] in children]
    seed = forks.seed_upto(session.id)
    return {
        "session": session,
        "origin": origin,
        "parent": parent,
        "marks": marks,
        "seed_upto": seed,
        "switches": _switches(request, session, origin, parent, marks, seed),
    }


def _branch(session: Session, at: int | None = None) -> dict[str, Any]:
    return {"id": session.id, "title": session.title or "Untitled session", "url": _chat(session.id, at)}


def _switch(at: int, place: int, branches: list[dict[str, Any]], index: int) -> dict[str, Any]:
    """A branch switcher (i of n): shown after event `place` of this page, moving
    between the branches taken at the parent's event `at`."""
    return {
        "at": at,
        "place": place,
        "index": index + 1,
        "count": len(branches),
        "prev": branches[index - 1] if index > 0 else None,
        "next": branches[index + 1] if index + 1 < len(branches) else None,
    }


def _switches(
    request: HttpRequest,
    session: Session,
    origin: dict[str, Any] | None,
    parent: Session | None,
    marks: list[dict[str, Any]],
    seed: int,
) -> list[dict[str, Any]]:
    """Branches in place (issue 34): the forks taken at one event of a session
    are branches of one conversation, the session itself the first. On the
    parent, a switcher at each event forked from; on a fork, one at the end
    of its seed (where it parted), among its parent's forks at that event."""
    out = []
    by_at: dict[int, list[dict[str, Any]]] = {}
    for mark in marks:
        by_at.setdefault(int(mark["at_seq"]), []).append(_branch(mark["session"]))
    for at, kids in sorted(by_at.items()):
        out.append(_switch(at, at, [_branch(session, at), *kids], 0))
    if origin is not None and parent is not None:
        at = int(origin["at_seq"])
        ids = [n["child"] for n in forks.forks_of(parent.id) if int(n["at_seq"]) == at]
        seen = {str(s.id): s for s in actions.visible(request.user, Session.objects.filter(id__in=ids))}
        siblings = [seen[i] for i in ids if i in seen]
        branches = [_branch(parent, at), *(_branch(s) for s in siblings)]
        index = next((i for i, s in enumerate(siblings, start=1) if s.id == session.id), None)
        if index is not None and seed:
            out.append(_switch(at, seed, branches, index))
    return out


@login_required
@require_GET
def fork_panel(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    session = session_for(request.user, session_id, "view")
    return render(request, "sessions/_fork_actions.html#panel", panel_context(request, session))


def _made(request: HttpRequest, session: Session, seq: int | None, act: Any) -> HttpResponse:
    """Run `act` (which forks); to the fork's chat, or back with why not."""
    if seq is None:
        messages.error(request, "Pick a message to fork from.")
        return HttpResponseRedirect(_chat(session.id))
    try:
        child = act(seq)
    except UnknownSession:
        raise Http404("no such session") from None
    except TerretError as exc:
        messages.error(request, f"No fork was made: {exc}")
        return HttpResponseRedirect(_chat(session.id, seq))
    messages.info(request, "This is a fork: its own session, from that point of the one it came from.")
    return HttpResponseRedirect(_chat(child.id))


@login_required
@require_POST
def fork_edit(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Edit and resend: fork just before the user message at `seq`, then send `text`."""
    session = session_for(request.user, session_id, "view")
    text = request.POST.get("text", "")
    return _made(
        request,
        session,
        _seq(request),
        lambda seq: actions.edit_and_resend(request.user, session.id, seq, text),
    )


@login_required
@require_POST
def fork_regenerate(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Regenerate: fork at the turn of the assistant message at `seq` and ask again."""
    session = session_for(request.user, session_id, "view")
    return _made(request, session, _seq(request), lambda seq: actions.regenerate(request.user, session.id, seq))


urlpatterns = [
    path("sessions/<uuid:session_id>/forks/", fork_panel, name="fork_panel"),
    path("sessions/<uuid:session_id>/forks/edit/", fork_edit, name="fork_edit"),
    path("sessions/<uuid:session_id>/forks/regenerate/", fork_regenerate, name="fork_regenerate"),
]
