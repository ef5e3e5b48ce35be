"""Monitors on behalf of people and of the agent: create, read, cancel, and
an operator's answer about an edition of unknown outcome (an alias of the
effect resolution, services/effects.py, which the edition's send is in).

`create` validates the whole request first (the schedule against the
profile's bounds, exactly as a schedule's; every source and the destination
by its kind, URLs through the SSRF check) and changes nothing on bad input.
Running a monitor is the clock's (sessions_app/monitors/run.py).
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import (
    IdempotencyConflict,
    InvalidInput,
    ScheduleLimit,
    SessionRevoked,
    UnknownMonitor,
)
from sessions_app.models import DeliveryLedger, Edition, Monitor, MonitorCandidate, Session, SourceScan
from sessions_app.monitors import destinations, sources
from sessions_app.monitors.run import SETTLING, call_id
from sessions_app.services import effects
from sessions_app.services.schedules import _first_due, check_spec
from sessions_app.tools import monitors as monitor_tools
from sessions_app.validation import clean_text

MAX_SOURCES = 20
MAX_KEY_CHARS = 200
QUIET = ("suppress", "send")
DIGESTS = ("host", "model")
MAX_LIVE = 20  # a session's active monitors
MAX_EDITIONS_READ = 200
# A schedule's timing and bounds (services/schedules.py check_spec: the profile's bounds when absent).
SCHEDULE_KEYS = ("every_seconds", "cron", "misfire", "max_runs", "expires_at")


def check_body(session: Session, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object")
    schedule = body.get("schedule")
    if not isinstance(schedule, dict):
        raise InvalidInput('schedule must be an object: {"every_seconds" | "cron", "misfire"}')
    if schedule.get("due_at") is not None:
        raise InvalidInput("a monitor recurs: give every_seconds or cron, not due_at")
    extra = set(schedule) - set(SCHEDULE_KEYS)
    if extra:
        raise InvalidInput(f"schedule takes {', '.join(SCHEDULE_KEYS)}; not {', '.join(sorted(extra))}")
    spec = check_spec(session.profile, {**schedule, "text": "monitor"})
    raw = body.get("sources")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_SOURCES:
        raise InvalidInput(f"sources must be a list of 1 to {MAX_SOURCES} sources")
    checked = []
    for source in raw:
        if not isinstance(source, dict):
            raise InvalidInput("each source must be an object")
        kind = sources.get(str(source.get("kind")))
        if kind is None:
            raise InvalidInput(f"source kind must be one of {', '.join(sources.names())}")
        checked.append(kind.check(source))
    seen = {(s["name"], s["partition"]) for s in checked}
    if len(seen) != len(checked):
        raise InvalidInput("two sources share a name and partition")
    dest = body.get("destination")
    if not isinstance(dest, dict):
        raise InvalidInput("destination must be an object")
    dkind = destinations.get(str(dest.get("kind")))
    if dkind is None:
        raise InvalidInput(f"destination kind must be one of {', '.join(destinations.names())}")
    quiet = body.get("quiet", "suppress")
    if quiet not in QUIET:
        raise InvalidInput(f"quiet must be one of {', '.join(QUIET)}")
    digest_by = body.get("digest", "host")
    if digest_by not in DIGESTS:
        raise InvalidInput(f"digest must be one of {', '.join(DIGESTS)}")
    return {
        "digest_by": digest_by,
        "spec": spec,
        "sources": checked,
        "destination": dkind.check(dest),
        "quiet": quiet,
    }


def create(
    session_id: uuid.UUID | str, body: Any, *, by: str, idempotency_key: str | None = None
) -> tuple[Monitor, bool]:
    """Make a monitor; returns it and whether it was made now (False: the
    idempotency key named one made before with the same request)."""
    session = Session.objects.select_related("profile").filter(id=session_id).first()
    if session is None:
        raise log.SessionNotFound(f"no session {session_id}")
    if session.revoked_seq is not None:
        raise SessionRevoked(f"session {session.id} is revoked; a staff member must restore it first")
    if getattr(session, "archived_at", None) is not None:
        raise InvalidInput("the session is archived")
    key = idempotency_key or (body.get("idempotency_key") if isinstance(body, dict) else None)
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS):
        raise InvalidInput(f"idempotency_key must be 1..{MAX_KEY_CHARS} characters")
    if key is not None:
        clean_text("idempotency_key", key)
    checked = check_body(session, body)
    spec = checked["spec"]
    now = timezone.now()
    with transaction.atomic():
        Session.objects.select_for_update().filter(id=session.id).first()  # one create at a time per session
        if key is not None:
            prior = Monitor.objects.filter(session_id=session.id, idempotency_key=key).first()
            if prior is not None:
                if prior.sources != checked["sources"] or prior.destination != checked["destination"]:
                    raise IdempotencyConflict("this idempotency key was used for a different monitor")
                return prior, False
        live = Monitor.objects.filter(session_id=session.id, status="active").count()
        if live >= MAX_LIVE:
            raise ScheduleLimit(f"the session holds {live} monitors, the most it may")
        m = Monitor.objects.create(
            session_id=session.id,
            sources=checked["sources"],
            destination=checked["destination"],
            quiet=checked["quiet"],
            digest_by=checked["digest_by"],
            every_seconds=spec.every_seconds,
            cron=spec.cron,
            misfire=spec.misfire,
            max_runs=spec.max_runs,
            expires_at=spec.expires_at,
            due_at=_first_due(spec, now),
            secret=secrets.token_urlsafe(32),
            idempotency_key=key,
            created_by=by,
            created_at=now,
            updated_at=now,
        )
    return m, True


def _check_id(monitor_id: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(monitor_id))
    except ValueError:
        raise UnknownMonitor(f"no monitor {monitor_id!r}") from None


def get(monitor_id: Any) -> Monitor:
    m = Monitor.objects.filter(id=_check_id(monitor_id)).first()
    if m is None:
        raise UnknownMonitor(f"no monitor {monitor_id!r}")
    return m


def of_session(session_id: uuid.UUID | str) -> list[Monitor]:
    return list(Monitor.objects.filter(session_id=session_id).order_by("-created_at")[:100])


def cancel(session_id: uuid.UUID | str, monitor_id: Any, *, by: str) -> Monitor:
    """Cancel a monitor: it runs no more periods. Its records stay; an edition
    being posted settles as it would."""
    mid = _check_id(monitor_id)
    with transaction.atomic():
        m = Monitor.objects.select_for_update().filter(id=mid, session_id=session_id).first()
        if m is None:
            raise UnknownMonitor(f"session {session_id} has no monitor {monitor_id}")
        if m.status != "cancelled":
            m.status, m.status_reason, m.due_at, m.updated_at = "cancelled", f"cancelled by {by}", None, timezone.now()
            m.save(update_fields=["status", "status_reason", "due_at", "updated_at"])
    return m


def coverage(m: Monitor) -> list[dict[str, Any]]:
    """The last scan of every configured source partition (None: not scanned yet)."""
    out = []
    for source in m.sources:
        name, partition = str(source.get("name") or source.get("url")), str(source.get("partition") or "default")
        scan = SourceScan.objects.filter(monitor=m, source=name, partition=partition).order_by("-id").first()
        out.append(
            {
                "source": name,
                "partition": partition,
                "coverage": scan.coverage if scan else None,
                "period": scan.period if scan else None,
                "pages": scan.pages if scan else 0,
                "items": scan.items if scan else 0,
                "error": scan.error if scan else "",
                "at": scan.created_at.isoformat() if scan else None,
                "evidence": scan.evidence if scan else {},
            }
        )
    return out


def as_json(m: Monitor, *, detail: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(m.id),
        "session_id": str(m.session_id),
        "status": m.status,
        "status_reason": m.status_reason,
        "schedule": {
            "every_seconds": m.every_seconds,
            "cron": m.cron or None,
            "misfire": m.misfire,
            "max_runs": m.max_runs,
            "expires_at": m.expires_at.isoformat() if m.expires_at else None,
        },
        "sources": m.sources,
        "destination": m.destination,
        "quiet": m.quiet,
        "digest": m.digest_by,
        "periods": m.periods,
        "next_due_at": m.due_at.isoformat() if m.due_at and m.status == "active" else None,
        "idempotency_key": m.idempotency_key,
        "created_by": m.created_by,
        "created_at": m.created_at.isoformat(),
    }
    if detail:
        out["coverage"] = coverage(m)
        out["pending_items"] = MonitorCandidate.objects.filter(monitor=m, status="pending").count()
        out["delivered_items"] = DeliveryLedger.objects.filter(monitor=m).count()
    return out


def editions(m: Monitor, *, limit: int = MAX_EDITIONS_READ) -> list[Edition]:
    return list(Edition.objects.filter(monitor=m).order_by("-period", "-created_at")[: max(1, min(limit, 200))])


def edition_json(e: Edition) -> dict[str, Any]:
    return {
        "id": str(e.id),
        "monitor_id": str(e.monitor_id),
        "period": e.period,
        "destination": e.destination,
        "status": e.status,
        "items": e.items,
        "scans": e.scans,
        "coverage": e.coverage,
        "digest": e.digest,
        "digest_by": e.digest_by,
        "receipt": e.receipt or None,
        "reason": e.reason,
        "attempts": e.attempts,
        "created_at": e.created_at.isoformat(),
        "updated_at": e.updated_at.isoformat(),
    }


RESOLUTIONS = ("rerun", "done", "failed")


def resolve_edition(
    m: Monitor, edition_id: Any, action: str, *, receipt: str = "", reason: str = "", by: str
) -> Edition:
    """An answer about an edition of unknown outcome: the effect resolution of
    its send (services/effects.py resolve, call `edition-<id>`), reached by the
    edition. done with the receipt the destination shows (its items are then
    delivered), failed (its items go back to pending for the next edition),
    or rerun (sent again under the same Idempotency-Key)."""
    if action not in RESOLUTIONS:
        raise InvalidInput(f"action must be one of {', '.join(RESOLUTIONS)}")
    try:
        eid = uuid.UUID(str(edition_id))
    except ValueError:
        raise UnknownMonitor(f"no edition {edition_id!r}") from None
    if not Edition.objects.filter(id=eid, monitor=m).exists():
        raise UnknownMonitor(f"monitor {m.id} has no edition {edition_id}")
    effects.resolve(m.session_id, call_id(eid), action, result=receipt, reason=reason, by=by)
    return Edition.objects.get(id=eid)


def attention() -> dict[str, list[dict[str, Any]]]:
    """What /ops/ shows of monitors: failed or partial coverage (the last scan
    of a partition), unknown editions, held editions; bounded."""
    bad_scans = []
    for m in Monitor.objects.filter(status="active").order_by("-updated_at")[:200]:
        for c in coverage(m):
            if c["coverage"] in ("partial", "failed"):
                bad_scans.append({"monitor_id": str(m.id), "session_id": str(m.session_id), **c})

    def editions_in(status: str) -> list[dict[str, Any]]:
        rows = Edition.objects.filter(status=status, monitor__status__in=SETTLING).select_related("monitor")
        return [
            {**edition_json(e), "session_id": str(e.monitor.session_id)}
            for e in rows.order_by("-updated_at")[:100]
            # a held edition matters while it is its monitor's newest: a later one settled what it held
            if status != "held" or e.period == e.monitor.periods
        ]

    unknown, held = editions_in("unknown"), editions_in("held")
    return {"coverage": bad_scans[:100], "unknown": unknown, "held": held}


def figures() -> dict[str, Any]:
    """/metrics: editions by status, items delivered, scans by coverage."""
    return {
        "editions": dict(Edition.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n")),
        "delivered": DeliveryLedger.objects.count(),
        "scans": dict(SourceScan.objects.values_list("coverage").annotate(n=Count("id")).values_list("coverage", "n")),
    }


class _AgentMonitors:
    """What the monitor.* tools reach (tools/monitors.py)."""

    def create(self, session_id: uuid.UUID, spec: dict[str, Any], *, by: str, key: str) -> dict[str, Any]:
        m, _ = create(session_id, spec, by=by, idempotency_key=key)
        return as_json(m)

    def list(self, session_id: uuid.UUID) -> list[dict[str, Any]]:
        return [as_json(m) for m in of_session(session_id)]

    def cancel(self, session_id: uuid.UUID, monitor_id: str, *, by: str) -> dict[str, Any]:
        return as_json(cancel(session_id, monitor_id, by=by))


def register_agent_tools() -> None:
    monitor_tools.register(_AgentMonitors())
