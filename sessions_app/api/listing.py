"""GET /api/sessions: the sessions a caller may read, newest first, paged.

Paging is by cursor over (created_at, id), both fixed when a session is
made, so pages never shift while sessions keep working: a session that
moves on is neither repeated nor skipped (sorting by last activity would do
both). The cursor is opaque to clients: "<created_at ISO>|<id>" in base64url.
Filters: `status` (Session.status, as a query over the same projection
columns) and `archived` (false: hidden archived sessions, as the web list;
true: only archived ones; all).
"""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from sessions_app.actions import visible
from sessions_app.errors import InvalidInput
from sessions_app.models import Session

MAX_LIMIT = 200
DEFAULT_LIMIT = 50

# Session.status as a filter: the same precedence as the property (models.py).
_OPEN = Q(open_turn_seq__isnull=False)
_HELD = _OPEN & (Q(revoked_seq__isnull=False) | Q(suspended_seq__isnull=False) | Q(blocked_seq__isnull=False))
STATUS_FILTERS: dict[str, Q] = {
    "idle": Q(open_turn_seq__isnull=True),
    "revoked": _OPEN & Q(revoked_seq__isnull=False),
    "suspended": _OPEN & Q(revoked_seq__isnull=True, suspended_seq__isnull=False),
    "blocked": _OPEN & Q(revoked_seq__isnull=True, suspended_seq__isnull=True, blocked_seq__isnull=False),
    "waiting_reconcile": _OPEN & ~_HELD & Q(unknown_effects__gt=0),
    "waiting_approval": _OPEN & ~_HELD & Q(unknown_effects__lte=0, pending_approvals__gt=0),
    "waiting_task": _OPEN & ~_HELD & Q(unknown_effects__lte=0, pending_approvals__lte=0, waiting_tasks__gt=0),
    "running": _OPEN & ~_HELD & Q(unknown_effects__lte=0, pending_approvals__lte=0, waiting_tasks__lte=0),
}


def encode_cursor(session: Session) -> str:
    raw = f"{session.created_at.isoformat()}|{session.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, sid = raw.partition("|")
        return datetime.fromisoformat(at), uuid.UUID(sid)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput("cursor is not one this API gave out (use next_cursor as it came)") from None


def _filtered(user: Any, status: str | None, archived: str) -> QuerySet[Session]:
    rows = visible(user, Session.objects.select_related("profile"))
    if status is not None:
        rows = rows.filter(STATUS_FILTERS[status])
    if archived == "false":
        rows = rows.filter(archived_at__isnull=True)
    elif archived == "true":
        rows = rows.filter(archived_at__isnull=False)
    return rows


def list_sessions(
    user: Any,
    *,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
    status: str | None = None,
    archived: str = "false",
) -> dict[str, Any]:
    """One page (at most `limit`) and the cursor of the next, None on the last page."""
    rows = _filtered(user, status, archived).order_by("-created_at", "-id")
    if cursor:
        at, sid = decode_cursor(cursor)
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=sid))
    page = list(rows[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return {
        "sessions": [summary(s) for s in page],
        "next_cursor": encode_cursor(page[-1]) if more and page else None,
    }


def summary(session: Session) -> dict[str, Any]:
    return {
        "id": str(session.id),
        "profile": session.profile.name if session.profile else None,
        "title": session.title,
        "status": session.status,
        "created_at": session.created_at.isoformat(),
        "last_event_at": session.last_event_at.isoformat() if session.last_event_at else None,
        "last_seq": session.last_seq,
        "pending_approvals": session.pending_approvals,
        "archived": session.archived_at is not None,
        "cost": float(session.cost),
    }
