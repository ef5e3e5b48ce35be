"""Who may do what to a session. Views, the JSON API and socket frames all ask here.

- view: the owner, staff, and reviewers (users with approvals_app.decide_approval)
- drive (chat, inject, cancel, set the policy or a model, compact): the owner and staff
- approve/deny: reviewers (the permission) who may view the session
- operators' actions (services/operators.py: suspend, resume, retry,
  abandon, revoke, restore): active staff
- resolve an effect of unknown outcome (re-run it, mark it done or failed):
  staff; the owner too when the setting TERRET_OWNER_MAY_RESOLVE is on
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

APPROVE_PERM = "approvals_app.decide_approval"


def is_reviewer(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.has_perm(APPROVE_PERM))


def can_view(user: Any, session: Any) -> bool:
    if not (user and user.is_authenticated and user.is_active):
        return False
    return bool(session.owner_id == user.pk or user.is_staff or is_reviewer(user))


def can_drive(user: Any, session: Any) -> bool:
    if not (user and user.is_authenticated and user.is_active):
        return False
    return bool(session.owner_id == user.pk or user.is_staff)


def can_approve(user: Any, session: Any) -> bool:
    return is_reviewer(user) and can_view(user, session)


def is_operator(user: Any) -> bool:
    """Operators' actions (suspend, resume, abandon, revoke): active staff."""
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def owner_may_resolve() -> bool:
    return bool(settings.TERRET_OWNER_MAY_RESOLVE)


def can_resolve(user: Any, session: Any) -> bool:
    if not can_drive(user, session):
        return False
    return bool(user.is_staff or (owner_may_resolve() and session.owner_id == user.pk))


def visible_sessions(user: Any, queryset: Any) -> Any:
    """Filter a Session queryset to what `user` may view."""
    if not (user and user.is_authenticated and user.is_active):
        return queryset.none()
    if user.is_staff or is_reviewer(user):
        return queryset
    return queryset.filter(owner=user)
