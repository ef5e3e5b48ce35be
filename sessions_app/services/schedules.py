"""Schedules on behalf of people and of the agent: create, list, cancel.

`check_spec` validates a request against the profile's bounds; `create`
writes the row and its `schedule/created` event in one transaction, so a
schedule exists exactly when the log says it was made. Firing is the
runtime's (runtime/schedules.py). An idempotency key is unique per session:
the same key with the same request answers the schedule it made, with a
different request a conflict.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise
from typing import Any

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from sessions_app import log
from sessions_app.errors import (
    IdempotencyConflict,
    InvalidInput,
    ScheduleLimit,
    SessionRevoked,
    TimeOutOfRange,
    UnknownSchedule,
)
from sessions_app.models import AgentProfile, Schedule, Session
from sessions_app.runtime.schedules import LIVE, next_after
from sessions_app.services.inputs import MAX_INPUT_CHARS
from sessions_app.tools import schedules as schedule_tools
from sessions_app.validation import clean_text, int_in_column

MISFIRES = Schedule.MISFIRES
MAX_KEY_CHARS = 200
MAX_REASON_CHARS = 200
# How far ahead a cron expression is checked against the shortest interval.
CRON_GAPS_CHECKED = 24


@dataclass(frozen=True)
class Spec:
    text: str
    due_at: datetime | None
    every_seconds: int | None
    cron: str
    misfire: str
    max_runs: int | None
    reason: str
    budget_tokens: int | None
    expires_at: datetime | None = None

    @property
    def recurring(self) -> bool:
        return bool(self.every_seconds or self.cron)

    def same_as(self, s: Schedule) -> bool:
        return (
            self.text == s.text
            and self.every_seconds == s.every_seconds
            and self.cron == s.cron
            and self.misfire == s.misfire
            and self.max_runs == s.max_runs
        )


def _int(value: Any, name: str, *, minimum: int = 1) -> int | None:
    if value is None:
        return None
    # Within the column too: past it, the insert would fail (PostgreSQL) after the checks passed.
    return int_in_column(name, value, Schedule._meta.get_field(name), minimum=minimum)


def check_time(when: datetime, *, now: datetime, name: str = "due_at") -> datetime:
    """The one check of a schedule's time, for every door (API, socket, the
    agent's tool, the page's form): within TERRET_SCHEDULE_HORIZON_DAYS of
    now either way, else TimeOutOfRange. A past time inside the range is
    kept: the misfire policy decides what it does. The bound is what keeps
    the clock safe: a time past year 9999 (or before year 1) in UTC, which
    the database stores but no datetime can hold, never reaches a row."""
    days = settings.TERRET_SCHEDULE_HORIZON_DAYS
    try:
        utc = when.astimezone(UTC)
    except OverflowError:
        raise TimeOutOfRange(f"{name} is outside the years 1..9999 in UTC") from None
    if abs(utc - now) > timedelta(days=days):
        raise TimeOutOfRange(f"{name} must be within {days} days of now ({utc:%Y-%m-%d %H:%M:%S} UTC is not)")
    return utc


def _when(value: Any, name: str = "due_at") -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed: datetime | None = value
    elif isinstance(value, str):
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            parsed = None
    else:
        parsed = None
    if parsed is None:
        raise InvalidInput(f"{name} must be an ISO 8601 date and time")
    if timezone.is_naive(parsed):
        raise InvalidInput(f"{name} must carry a time zone (for example Z or +00:00)")
    return parsed


def check_spec(profile: AgentProfile | None, body: dict[str, Any], *, now: datetime | None = None) -> Spec:
    """A request made valid, or InvalidInput / ScheduleLimit saying what is wrong."""
    now = now or timezone.now()
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("text must be a non-empty string")
    if len(text) > MAX_INPUT_CHARS:
        raise InvalidInput(f"text must be at most {MAX_INPUT_CHARS} characters")
    for name in ("text", "cron", "reason"):
        if isinstance(body.get(name), str):
            clean_text(name, body[name])
    due_at = _when(body.get("due_at"))
    every = _int(body.get("every_seconds"), "every_seconds")
    cron = body.get("cron") or ""
    if not isinstance(cron, str) or len(cron) > 120:
        raise InvalidInput("cron must be a cron expression of at most 120 characters")
    if every and cron:
        raise InvalidInput("give every_seconds or cron, not both")
    if due_at is None and not every and not cron:
        raise InvalidInput("give due_at for a one-shot schedule, or every_seconds or cron for a recurring one")
    misfire = body.get("misfire") or "run_once"
    if misfire not in MISFIRES:
        raise InvalidInput(f"misfire must be one of {', '.join(MISFIRES)}")
    reason = body.get("reason") or ""
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise InvalidInput(f"reason must be at most {MAX_REASON_CHARS} characters")
    expires_at = _when(body.get("expires_at"), "expires_at")
    if expires_at is not None:
        expires_at = check_time(expires_at, now=now, name="expires_at")
        if expires_at <= now:
            raise InvalidInput("expires_at must lie in the future")
    spec = Spec(
        text,
        None if due_at is None else check_time(due_at, now=now),
        every,
        cron.strip(),
        misfire,
        _int(body.get("max_runs"), "max_runs"),
        reason,
        _int(body.get("budget_tokens"), "budget_tokens"),
        expires_at,
    )
    _check_bounds(profile, spec, now)
    return _bounded(profile, spec, now)


def _bounded(profile: AgentProfile | None, spec: Spec, now: datetime) -> Spec:
    """Bounded by default: a recurring schedule made without its own
    max_runs or expires_at gets the profile's (schedule_max_runs,
    schedule_expires_days; None there: no such bound), whoever makes it."""
    if profile is None or not spec.recurring:
        return spec
    max_runs = spec.max_runs if spec.max_runs is not None else profile.schedule_max_runs
    expires_at = spec.expires_at
    if expires_at is None and profile.schedule_expires_days is not None:
        horizon = settings.TERRET_SCHEDULE_HORIZON_DAYS
        expires_at = now + timedelta(days=min(profile.schedule_expires_days, horizon))
    return replace(spec, max_runs=max_runs, expires_at=expires_at)


def _check_bounds(profile: AgentProfile | None, spec: Spec, now: datetime) -> None:
    if profile is None:
        raise InvalidInput("the session has no agent profile")
    if profile.max_schedules == 0:
        raise ScheduleLimit(f"profile {profile.name} allows no schedules")
    shortest = profile.min_schedule_seconds
    if spec.every_seconds is not None and spec.every_seconds < shortest:
        raise ScheduleLimit(f"every_seconds must be at least {shortest} (the profile's shortest interval)")
    if spec.cron:
        try:
            times = list(islice(CronSim(spec.cron, now), CRON_GAPS_CHECKED + 1))
        except CronSimError as exc:
            raise InvalidInput(f"cron: {exc}") from exc
        gaps = [(b - a).total_seconds() for a, b in pairwise(times)]
        if gaps and min(gaps) < shortest:
            raise ScheduleLimit(f"cron fires every {int(min(gaps))} s at times; the profile's shortest is {shortest} s")


def _first_due(spec: Spec, now: datetime) -> datetime:
    """The first due time, itself held to the range (an interval of decades
    would otherwise name a time no one will see, or none a datetime holds)."""
    if spec.due_at is not None:
        return spec.due_at
    if spec.cron:
        return check_time(next(iter(CronSim(spec.cron, now))), now=now, name="the cron's first due time")
    assert spec.every_seconds is not None
    try:
        first = now + timedelta(seconds=spec.every_seconds)
    except OverflowError:
        raise TimeOutOfRange("every_seconds names a first due time past the year 9999") from None
    return check_time(first, now=now, name="the first due time (now + every_seconds)")


def create(
    session_id: uuid.UUID | str, body: dict[str, Any], *, by: str, idempotency_key: str | None = None
) -> tuple[Schedule, bool]:
    """Make a schedule; returns it and whether it was made now (False: the
    idempotency key named one made before with the same request)."""
    session = Session.objects.select_related("profile").filter(id=session_id).first()
    if session is None:
        raise log.SessionNotFound(f"no session {session_id}")
    if session.revoked_seq is not None:
        raise SessionRevoked(f"session {session.id} is revoked; a staff member must restore it first")
    if getattr(session, "archived_at", None) is not None:
        raise InvalidInput("the session is archived")
    key = idempotency_key or body.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS):
        raise InvalidInput(f"idempotency_key must be 1..{MAX_KEY_CHARS} characters")
    if key is not None:
        clean_text("idempotency_key", key)
    now = timezone.now()
    spec = check_spec(session.profile, body, now=now)
    first_due = _first_due(spec, now)
    with log.locked(session.id) as tx:
        if key is not None:
            prior = Schedule.objects.filter(session_id=session.id, idempotency_key=key).first()
            if prior is not None:
                if not spec.same_as(prior):
                    raise IdempotencyConflict("this idempotency key was used for a different schedule")
                return prior, False
        assert session.profile is not None
        live = Schedule.objects.filter(session_id=session.id, status__in=LIVE).count()
        if live >= session.profile.max_schedules:
            raise ScheduleLimit(f"the session holds {live} schedules, its profile's most")
        s = Schedule.objects.create(
            session_id=session.id,
            due_at=first_due,
            reason=spec.reason,
            text=spec.text,
            every_seconds=spec.every_seconds,
            cron=spec.cron,
            misfire=spec.misfire,
            max_runs=spec.max_runs,
            expires_at=spec.expires_at,
            budget_tokens=spec.budget_tokens,
            idempotency_key=key,
            created_by=by,
            created_at=now,
            updated_at=now,
        )
        tx.append(
            "schedule/created",
            {
                "schedule_id": str(s.id),
                "by": by,
                "due_at": s.due_at.isoformat() if s.due_at else None,
                "every_seconds": s.every_seconds,
                "cron": s.cron,
                "misfire": s.misfire,
                "max_runs": s.max_runs,
                "expires_at": s.expires_at.isoformat() if s.expires_at else None,
                "reason": s.reason,
            },
        )
    return s, True


def _check_id(schedule_id: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(schedule_id))
    except ValueError:
        raise UnknownSchedule(f"no schedule {schedule_id!r}") from None


def cancel(session_id: uuid.UUID | str, schedule_id: Any, *, by: str, reason: str = "") -> Schedule:
    """Cancel a live (pending or paused) schedule; cancelling a cancelled one
    answers it as it is. A finished one cannot be cancelled (InvalidInput)."""
    sid = _check_id(schedule_id)
    with transaction.atomic():
        # The schedule row first, then the session's: the clock's order too.
        s = Schedule.objects.select_for_update().filter(id=sid, session_id=session_id).first()
        if s is None:
            raise UnknownSchedule(f"session {session_id} has no schedule {schedule_id}")
        if s.status == "cancelled":
            return s
        if s.status not in LIVE:
            raise InvalidInput(f"schedule {s.id} is {s.status}; only a pending or paused schedule can be cancelled")
        _cancel_row(s, by=by, reason=reason or "cancelled")
    return s


def _cancel_row(s: Schedule, *, by: str, reason: str) -> None:
    data = {"schedule_id": str(s.id), "reason": reason}
    if by:
        data["by"] = by
    log.append(s.session_id, "schedule/cancelled", data)
    s.status = "cancelled"
    s.status_reason = reason
    s.due_at = None
    s.updated_at = timezone.now()
    s.save()


def cancel_for_session(session_id: uuid.UUID | str, *, reason: str, by: str = "") -> int:
    """Cancel every live schedule of a session (it was revoked or archived)."""
    with transaction.atomic():
        rows = list(Schedule.objects.select_for_update().filter(session_id=session_id, status__in=LIVE))
        for s in rows:
            _cancel_row(s, by=by, reason=reason)
    return len(rows)


def resume(session_id: uuid.UUID | str, schedule_id: Any, *, by: str) -> Schedule:
    """A paused schedule runs again from its next due time after now."""
    sid = _check_id(schedule_id)
    with transaction.atomic():
        s = Schedule.objects.select_for_update().filter(id=sid, session_id=session_id).first()
        if s is None:
            raise UnknownSchedule(f"session {session_id} has no schedule {schedule_id}")
        if s.status != "paused":
            raise InvalidInput(f"schedule {s.id} is {s.status}, not paused")
        now = timezone.now()
        s.status, s.status_reason, s.no_progress = "pending", "", 0
        s.due_at = next_after(s, now) or now
        s.updated_at = now
        s.save()
    return s


def of_session(session_id: uuid.UUID | str) -> list[Schedule]:
    return list(Schedule.objects.filter(session_id=session_id).order_by("-created_at")[:200])


def as_json(s: Schedule) -> dict[str, Any]:
    return {
        "id": str(s.id),
        "session_id": str(s.session_id),
        "status": s.status,
        "status_reason": s.status_reason,
        "text": s.text,
        "reason": s.reason,
        "due_at": s.due_at.isoformat() if s.due_at else None,
        "next_due_at": s.due_at.isoformat() if s.due_at and s.status == "pending" else None,
        "every_seconds": s.every_seconds,
        "cron": s.cron or None,
        "misfire": s.misfire,
        "max_runs": s.max_runs,
        "expires_at": s.expires_at.isoformat() if s.expires_at else None,
        "runs": s.runs,
        "skipped": s.skipped,
        "budget_tokens": s.budget_tokens,
        "spent_tokens": s.spent_tokens,
        "idempotency_key": s.idempotency_key,
        "last_outcome": s.last_outcome,
        "created_by": s.created_by,
        "created_at": s.created_at.isoformat(),
    }


class _AgentScheduler:
    """What the schedule.* tools reach (tools/schedules.py)."""

    def create(self, session_id: uuid.UUID, spec: dict[str, Any], *, by: str, key: str) -> dict[str, Any]:
        s, _ = create(session_id, spec, by=by, idempotency_key=key)
        return as_json(s)

    def list(self, session_id: uuid.UUID) -> list[dict[str, Any]]:
        return [as_json(s) for s in of_session(session_id)]

    def cancel(self, session_id: uuid.UUID, schedule_id: str, *, by: str) -> dict[str, Any]:
        return as_json(cancel(session_id, schedule_id, by=by, reason="cancelled by the agent"))


def register_agent_tools() -> None:
    schedule_tools.register(_AgentScheduler())
