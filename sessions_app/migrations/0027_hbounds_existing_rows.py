"""Bounded by default holds for what exists today (issue 31): the profiles
without a daily cost or token budget get the settings' defaults, the live
recurring schedules without max_runs or expires_at get their profile's
(an expiry counted from now, not from the schedule's creation, so no old
schedule ends at the upgrade), and every session's unresolved_effects
counts its attempts of unknown outcome that no operator has resolved yet."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import migrations
from django.db.models import Count, Q
from django.utils import timezone

LIVE = ("pending", "paused")


def _profiles(apps: Any) -> None:
    AgentProfile = apps.get_model("sessions_app", "AgentProfile")
    cost = getattr(settings, "TERRET_PROFILE_DAILY_COST_USD", None)
    tokens = getattr(settings, "TERRET_PROFILE_DAILY_TOKENS", None)
    if cost is not None:
        AgentProfile.objects.filter(daily_cost_usd__isnull=True).update(daily_cost_usd=cost)
    if tokens is not None:
        AgentProfile.objects.filter(daily_tokens__isnull=True).update(daily_tokens=tokens)


def _schedules(apps: Any) -> None:
    Schedule = apps.get_model("sessions_app", "Schedule")
    now = timezone.now()
    horizon = timedelta(days=settings.TERRET_SCHEDULE_HORIZON_DAYS)
    recurring = Schedule.objects.filter(status__in=LIVE).filter(Q(every_seconds__isnull=False) | ~Q(cron=""))
    for s in recurring.filter(Q(max_runs__isnull=True) | Q(expires_at__isnull=True)).select_related(
        "session__profile"
    ):
        profile = s.session.profile
        if s.max_runs is None and profile is not None and profile.schedule_max_runs is not None:
            s.max_runs = profile.schedule_max_runs
        if s.expires_at is None and profile is not None and profile.schedule_expires_days is not None:
            s.expires_at = now + min(timedelta(days=profile.schedule_expires_days), horizon)
        s.save(update_fields=["max_runs", "expires_at"])


def _unresolved(apps: Any) -> None:
    Event = apps.get_model("sessions_app", "Event")
    Session = apps.get_model("sessions_app", "Session")
    counts: dict[Any, int] = {}
    rows = Event.objects.filter(kind__in=("tool/unknown", "tool/resolved")).values("session_id", "kind")
    for row in rows.annotate(n=Count("seq")).order_by():
        sign = 1 if row["kind"] == "tool/unknown" else -1
        counts[row["session_id"]] = counts.get(row["session_id"], 0) + sign * row["n"]
    for session_id, n in counts.items():
        if n > 0:
            Session.objects.filter(id=session_id).update(unresolved_effects=n)


def forwards(apps: Any, schema_editor: Any) -> None:
    _profiles(apps)
    _schedules(apps)
    _unresolved(apps)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0026_hbounds_bounded_defaults")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
