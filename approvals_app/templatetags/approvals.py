"""Template helpers that keep approvals/inline.html self-contained: any page
can include it with just `session` (and optionally `pending`)."""

from __future__ import annotations

import json
from typing import Any

from django import template

from approvals_app.selectors import PendingCall, QueueItem, inline_for, with_times
from sessions_app.permissions import can_approve

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
    return bool(user is not None and can_approve(user, session))


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
