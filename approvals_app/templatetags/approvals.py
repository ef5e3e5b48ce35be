"""Template helpers that keep approvals/inline.html self-contained: any page
can include it with just `session` (and optionally `pending`)."""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.db import DatabaseError

from approvals_app.selectors import PendingCall, QueueItem, inline_for, pending_count, with_times
from sessions_app import actions
from sessions_app.live.paths import socket_url

register = template.Library()


@register.simple_tag
def approval_items(session: Any, pending: list[PendingCall] | None = None) -> list[QueueItem]:
    """The session's waiting calls with their request times. `pending` (as the
    chat page already read it) saves a read; otherwise the log is read."""
    if pending is None:
        return inline_for(session.id)
    return with_times(session.id, session.title, pending)


@register.simple_tag(takes_context=True)
def can_decide(context: template.Context, session: Any) -> bool:
    """For the request's user, or for `user` when a socket renders the fragment."""
    request = context.get("request")
    user = request.user if request is not None else context.get("user")
    return bool(user is not None and actions.allowed(user, session, "approve"))


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.inclusion_tag("approvals/nav.html", takes_context=True)
def approvals_nav(context: template.Context) -> dict[str, Any]:
    """The navigation bar's Approvals link with the count of calls waiting,
    for reviewers (nothing for anyone else). Kept live by
    static/js/terret-approvals.js over /ws/approvals/?count=1, which also puts
    the count in the tab's title."""
    request = context.get("request")
    user = request.user if request is not None else context.get("user")
    if user is None or not actions.reviews(user):
        return {"show": False}
    try:
        count: int | None = pending_count(user)
    except DatabaseError:
        # Error pages render the bar too: a database outage must not turn them into a 500.
        count = None
    return {"show": True, "count": count, "socket": socket_url("approvals") + "?count=1"}
