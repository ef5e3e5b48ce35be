"""Who may do what to a session. Views, the JSON API and socket frames all ask here.

- view: the owner, staff, and reviewers (users with approvals_app.decide_approval)
- drive (chat, inject, cancel, set the policy or a model, compact): the owner and staff
- approve/deny: reviewers (the permission) who may view the session; a
  verdict records its grounds (`grounds_of`), and an approval runs only
  while its reviewer still holds them (`lapsed`)
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


def grounds_of(user: Any) -> dict[str, Any]:
    """What a reviewer's right to decide rests on, as a verdict records it:
    "staff" (a superuser, or staff holding the permission), "reviewers" (a
    group that grants the permission, named in `group`), or "permission"
    (granted to the account itself)."""
    group = None if user.is_superuser else _granting_group(user)
    if group is not None:
        return {"as": "reviewers", "group": group, "user_id": user.pk}
    return {"as": "staff" if user.is_staff or user.is_superuser else "permission", "user_id": user.pk}


def lapsed(grounds: Any, user: Any) -> str | None:
    """Why a verdict given on `grounds` no longer stands for `user` (None if
    it does): the account is gone or inactive, or it lost those grounds."""
    if user is None:
        return "reviewer_deleted"
    if not user.is_active:
        return "reviewer_inactive"
    basis = grounds.get("as") if isinstance(grounds, dict) else None
    if basis == "reviewers" and not _in_granting_group(user, str(grounds.get("group", ""))):
        return "reviewer_left_group"
    if basis == "staff" and not ((user.is_staff or user.is_superuser) and is_reviewer(user)):
        return "reviewer_not_staff"
    if not is_reviewer(user):
        return "reviewer_lost_permission"
    return None


def _granting_group(user: Any) -> str | None:
    app, codename = APPROVE_PERM.split(".")
    names = list(
        user.groups.filter(permissions__content_type__app_label=app, permissions__codename=codename)
        .order_by("name")
        .values_list("name", flat=True)
    )
    return "reviewers" if "reviewers" in names else (names[0] if names else None)


def _in_granting_group(user: Any, group: str) -> bool:
    app, codename = APPROVE_PERM.split(".")
    return bool(
        user.groups.filter(
            name=group, permissions__content_type__app_label=app, permissions__codename=codename
        ).exists()
    )


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
