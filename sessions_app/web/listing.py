"""The session list: search by title, archived or not, 50 a page, newest
activity first. Shared by the list page and the live fragment its socket
sends (the dashboard's socket, web/dashboard.py's list branch)."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.db.models import Exists, F, OuterRef, Q
from django.template.loader import render_to_string

from sessions_app import actions
from sessions_app.actions.words import shown_state
from sessions_app.live.paths import socket_url
from sessions_app.models import Agent, Event, Session
from sessions_app.services.usage import format_cost

LIST_PAGE_SIZE = 50
MAX_QUERY_CHARS = 80
# What the list page asks the dashboard's socket for (?page=list-N): the
# list's own body, rendered for the socket's user (sessions_app/web/dashboard.py).
LIST_PAGE_PREFIX = "list-"


def agent_id_of(session: Session) -> str:
    try:
        return session.agent.agent_id
    except Agent.DoesNotExist:  # disposed: the session stays readable
        return ""


# The kinds a content search reads, and the key that holds each one's text.
SEARCHED_TEXT = {"user/message": "text", "assistant/message": "content", "input/deferred": "text"}


def _messages_matching(query: str) -> Any:
    """The events of the outer session whose message text contains `query`
    (case-insensitive): a search covers what was said, not only titles."""
    said = Q()
    for kind, key in SEARCHED_TEXT.items():
        said |= Q(kind=kind, **{f"data__{key}__icontains": query})
    return Event.objects.filter(said, session_id=OuterRef("pk"))


def families(sessions: list[Session]) -> list[tuple[Session, int]]:
    """The page's sessions with each fork under its parent (when both are on
    the page), in the page's order otherwise: (session, depth). One read: the
    forks' first events (session/forked names the parent)."""
    ids = [s.id for s in sessions]
    parent_of = {
        str(sid): str((data or {}).get("parent", ""))
        for sid, data in Event.objects.filter(session_id__in=ids, seq=1, kind="session/forked").values_list(
            "session_id", "data"
        )
    }
    on_page = {str(s.id) for s in sessions}
    children: dict[str, list[Session]] = {}
    roots = []
    for s in sessions:
        parent = parent_of.get(str(s.id), "")
        if parent in on_page:
            children.setdefault(parent, []).append(s)
        else:
            roots.append(s)
    out: list[tuple[Session, int]] = []

    def add(s: Session, depth: int) -> None:
        out.append((s, depth))
        for child in children.get(str(s.id), []):
            if len(out) <= len(sessions):  # forks form a tree; the bound only guards against bad data
                add(child, depth + 1)

    for s in roots:
        add(s, 0)
    return out


def list_context(user: Any, page_number: Any, *, query: str = "", archived: bool = False) -> dict[str, Any]:
    query = " ".join(query.split())[:MAX_QUERY_CHARS]
    qs = actions.visible(user, Session.objects.all())
    qs = qs.filter(archived_at__isnull=not archived)
    if query:
        qs = qs.filter(Q(title__icontains=query) | Exists(_messages_matching(query)))
    qs = qs.select_related("profile", "owner", "agent").order_by(
        F("last_event_at").desc(nulls_last=True), "-created_at"
    )
    page = Paginator(qs, LIST_PAGE_SIZE).get_page(page_number)
    rows = [
        {
            "session": s,
            "agent_id": agent_id_of(s),
            "state": shown_state(s)[0],
            "status_label": shown_state(s)[1],
            "cost_text": format_cost(s.cost, s.unpriced_entries),
            "depth": depth,
        }
        for s, depth in families(list(page.object_list))
    ]
    show_owner = actions.sees_all(user)
    # Only the plain list follows live: a search or the archive is a snapshot.
    live = not query and not archived
    return {
        "page": page,
        "rows": rows,
        "show_owner": show_owner,
        "query": query,
        "archived": archived,
        "live": live,
        "socket_url": socket_url("dashboard"),
        "live_page": f"{LIST_PAGE_PREFIX}{page.number}",
    }


def list_fragment(user: Any, page_number: Any) -> str:
    """The list's body as its socket sends it (an out-of-band swap)."""
    return render_to_string("sessions/list.html#body", {**list_context(user, page_number), "oob": True})
