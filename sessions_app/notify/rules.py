"""What needs a human, and who is told: the table from an event's kind to a
notification. A kind that does not exist yet (session/stranded) costs nothing
until something appends it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db.models import Q, QuerySet

from sessions_app.log import AppendedEvent
from sessions_app.models import Session
from sessions_app.permissions import APPROVE_PERM

Recipients = Callable[[Session, AppendedEvent], "QuerySet[Any]"]


def _users() -> QuerySet[Any]:
    return get_user_model().objects.filter(is_active=True)


def reviewers(session: Session, event: AppendedEvent) -> QuerySet[Any]:
    """Who may decide the approval: staff, and holders of the approval
    permission (the reviewers group, or given to the user)."""
    app_label, codename = APPROVE_PERM.split(".")
    perm = Permission.objects.filter(content_type__app_label=app_label, codename=codename)
    return _users().filter(
        Q(is_staff=True) | Q(is_superuser=True) | Q(groups__permissions__in=perm) | Q(user_permissions__in=perm)
    )


def escalation(session: Session, event: AppendedEvent) -> QuerySet[Any]:
    """The group the approval was escalated to, if the event names one; else the reviewers."""
    group = next((event.data[k] for k in ("escalate_to", "group", "to") if isinstance(event.data.get(k), str)), None)
    return _users().filter(groups__name=group) if group else reviewers(session, event)


def owner_and_operators(session: Session, event: AppendedEvent) -> QuerySet[Any]:
    """The session's owner and the operators (active staff)."""
    return _users().filter(Q(pk=session.owner_id) | Q(is_staff=True))


def _always(data: dict[str, Any]) -> bool:
    return True


def _budget_hold(data: dict[str, Any]) -> bool:
    # An operator's suspension holds input too; the operator knows already.
    return isinstance(data.get("reason"), dict) and "budget" in data["reason"]


def _approval(data: dict[str, Any]) -> str:
    return f"approval needed for {data.get('name', 'a tool call')}"


def _escalated(data: dict[str, Any]) -> str:
    return f"approval escalated: {data.get('name') or data.get('call_id') or 'a parked call'}"


def _blocked(data: dict[str, Any]) -> str:
    return f"turn blocked: {data.get('reason', '')}".rstrip(": ")


def _unknown(data: dict[str, Any]) -> str:
    return f"effect of unknown outcome: {data.get('name', 'a tool call')}"


def _held(data: dict[str, Any]) -> str:
    reason = data["reason"]
    return f"budget exhausted: {reason['budget']} ({reason.get('scope', 'session')}), input held"


def _fixed(text: str) -> Callable[[dict[str, Any]], str]:
    return lambda data: text


@dataclass(frozen=True)
class Rule:
    name: str  # the notification's name: the webhook body's "event"
    recipients: Recipients
    summary: Callable[[dict[str, Any]], str]
    applies: Callable[[dict[str, Any]], bool] = _always


RULES: dict[str, Rule] = {
    "approval/requested": Rule("approval_requested", reviewers, _approval),
    "approval/escalated": Rule("approval_escalated", escalation, _escalated),
    "turn/blocked": Rule("turn_blocked", owner_and_operators, _blocked),
    "tool/unknown": Rule("effect_unknown", owner_and_operators, _unknown),
    "input/held": Rule("budget_exhausted", owner_and_operators, _held, _budget_hold),
    "turn/stalled": Rule("turn_stalled", owner_and_operators, _fixed("turn stalled: no progress")),
    "session/stranded": Rule("session_stranded", owner_and_operators, _fixed("session stranded")),
}
