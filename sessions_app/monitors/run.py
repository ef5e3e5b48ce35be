"""A monitor's periods: collection, the edition, its publication.

Every worker's clock thread (runtime/schedules.py, through
runtime.hooks.register_clock) calls `tick()`. A tick claims a monitor that
is due, or that has an edition to settle, by a conditional UPDATE of its
lease (one worker at a time on a monitor, on PostgreSQL and SQLite alike),
and runs it outside any transaction. Every write it then makes is fenced
on that lease (`_fenced`): a worker whose lease expired and was taken over
commits nothing more.

Phases, each its own commit, so a crash (kill -9) between any two loses
nothing and sends nothing twice:

1. settle: an edition left `posting` by a dead worker becomes `unknown`
   (the request may have gone out); an `unknown` edition is re-sent under
   the same Idempotency-Key (its id) when the destination honours one, and
   otherwise waits for an operator. Nothing else is sent while one is
   unresolved: later periods still collect, and their editions are `held`.
2. scan, per source partition: the pages are read first, then the scan's
   record, its new candidates (item versions neither pending nor delivered)
   and, for a complete scan only, the advanced checkpoint commit together.
   A crash mid-scan commits nothing: the next run rescans.
3. decide: the period's edition (prepared, suppressed, or held) with the
   pending candidates it takes, and the monitor's next due time, in one
   commit.
4. publish: `posting` is committed before the send (the intent); the
   destination's receipt after. Only a confirmed receipt writes delivered
   entries (DeliveryLedger); a failed send hands its candidates back to
   pending for the next edition; an unknown one keeps them assigned.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import LeaseLost
from sessions_app.llm.registry import complete_utility
from sessions_app.llm.types import ModelError
from sessions_app.models import (
    DeliveryLedger,
    Edition,
    Monitor,
    MonitorCandidate,
    MonitorCheckpoint,
    Schedule,
    Session,
    SourceScan,
)
from sessions_app.monitors import destinations, sources
from sessions_app.monitors.destinations import Confirmed, Failed, Publication
from sessions_app.monitors.sources.mcp import SESSION_KEY
from sessions_app.runtime import failpoints, limits
from sessions_app.runtime.failures import is_database_outage
from sessions_app.runtime.roles import resolve_spec
from sessions_app.runtime.schedules import OWNER_INACTIVE, next_after

logger = logging.getLogger(__name__)

OPEN = ("prepared", "posting", "unknown")
MAX_ITEMS = 500  # an edition's items; more wait, pending, for the next
ROUND = 10  # monitors one tick runs at most
FAILPOINT = "monitor"
RETRY_SECONDS = 60  # a period that failed on an unexpected error is tried again after this


def lease_seconds() -> float:
    return float(settings.TERRET_MONITOR_LEASE_SECONDS)


def resend_seconds() -> float:
    return float(settings.TERRET_MONITOR_RESEND_SECONDS)


def tick(*, now: datetime | None = None) -> int:
    """Run what is due, a monitor at a time; how many were run."""
    handled = 0
    seen: set[uuid.UUID] = set()  # once a tick each: a failing monitor cannot take a whole round
    for _ in range(ROUND):
        at = now or timezone.now()
        claimed = _claim(at, seen)
        if claimed is None:
            break
        monitor_id, token = claimed
        seen.add(monitor_id)
        try:
            run(monitor_id, token, now=at)
        except LeaseLost:
            logger.warning("monitor %s: lease lost mid-period; its new holder goes on", monitor_id)
        except Exception as exc:
            if is_database_outage(exc):
                raise
            logger.exception("monitor %s: the period failed", monitor_id)
            # Tried again after a pause, not at every tick; collection resumes from the checkpoints.
            retry = at + timedelta(seconds=RETRY_SECONDS)
            Monitor.objects.filter(id=monitor_id, lease_token=token).update(
                status_reason=f"the last period failed: {type(exc).__name__}: {exc}"[:300]
            )
            Monitor.objects.filter(id=monitor_id, lease_token=token, due_at__lt=retry).update(due_at=retry)
        finally:
            Monitor.objects.filter(id=monitor_id, lease_token=token).update(lease_token="", lease_until=None)
        handled += 1
    return handled


def _claim(now: datetime, seen: set[uuid.UUID]) -> tuple[uuid.UUID, str] | None:
    """A monitor that is due or has an edition to settle, and no live lease:
    taken by a conditional UPDATE, so two workers never both take it."""
    settle = Edition.objects.filter(
        Q(status__in=("prepared", "posting"))
        | Q(status="unknown", resendable=True, updated_at__lt=now - timedelta(seconds=resend_seconds()))
    ).values("monitor_id")
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    ids = list(
        Monitor.objects.filter(free, status="active")
        .exclude(id__in=seen)
        .filter(Q(due_at__lte=now) | Q(id__in=settle))
        .order_by("due_at")
        .values_list("id", flat=True)[:ROUND]
    )
    for mid in ids:
        token = secrets.token_hex(8)
        took = (
            Monitor.objects.filter(free, id=mid, status="active")
            .filter(Q(due_at__lte=now) | Q(id__in=settle))
            .update(lease_token=token, lease_until=now + timedelta(seconds=lease_seconds()))
        )
        if took:
            return mid, token
    return None


def _fenced(monitor_id: uuid.UUID, token: str) -> Monitor:
    """The monitor row, locked, while `token` still holds its lease (which is
    renewed); LeaseLost otherwise. Call inside a transaction."""
    m = Monitor.objects.select_for_update().filter(id=monitor_id, lease_token=token).first()
    if m is None:
        raise LeaseLost(f"monitor {monitor_id}: the lease passed to another worker")
    m.lease_until = timezone.now() + timedelta(seconds=lease_seconds())
    m.save(update_fields=["lease_until"])
    return m


def run(monitor_id: uuid.UUID, token: str, *, now: datetime) -> None:
    m = Monitor.objects.select_related("session__owner", "session__profile").get(id=monitor_id)
    stop = stopped(m.session)
    if stop is not None:
        with transaction.atomic():
            _fenced(m.id, token)
            Monitor.objects.filter(id=m.id).update(status="cancelled", status_reason=stop, due_at=None, updated_at=now)
        return
    hold = held(m.session)
    # Under a hold (an operator's suspension, a budget) nothing is sent, not even a reconciling re-send;
    # collection goes on and the period's edition is held.
    settled = settle(m, token, send=hold is None) and hold is None
    if m.due_at is not None and m.due_at <= now:
        blocked = hold or (
            None if settled else "an earlier edition's outcome is unknown: it is reconciled before any other send"
        )
        edition = period(m, token, now, blocked=blocked)
        if edition is not None and edition.status == "prepared":
            publish(edition.id, token)


def stopped(session: Session) -> str | None:
    """Why the monitor ends for good (as a schedule does): its session revoked or archived, its owner inactive."""
    if session.revoked_seq is not None:
        return "the session was revoked"
    if session.archived_at is not None:
        return "the session was archived"
    if not session.owner.is_active:
        return OWNER_INACTIVE
    return None


def held(session: Session) -> str | None:
    """Why nothing may be sent now: an operator's hold, a budget (the schedules' own checks)."""
    profile = session.profile
    if profile is None:
        return "held: the session has no agent profile"
    hold = limits.hold_of(profile, suspended=session.suspended_seq is not None)
    if hold is not None:
        return f"held: {hold.message}"
    budgeted = any(getattr(session, f"budget_{name}") is not None for name in limits.BUDGETS)
    over = limits.check(session.id, profile, opening=True, budgeted=budgeted, parent=session.parent_session_id)
    if over is not None:
        return f"held: budget: {over.message}"
    return None


def settle(m: Monitor, token: str, *, send: bool = True) -> bool:
    """Settle open editions, oldest first; False while one stays unresolved
    (nothing else may be sent then). Without `send` (a hold) an orphaned
    `posting` edition still becomes `unknown`, but nothing goes out."""
    for e in Edition.objects.filter(monitor=m, status__in=OPEN).order_by("period"):
        if e.status == "posting":
            with transaction.atomic():
                _fenced(m.id, token)
                Edition.objects.filter(id=e.id, status="posting").update(
                    status="unknown",
                    reason="the worker posting it stopped before the receipt: the outcome is unknown",
                    updated_at=timezone.now(),
                )
            e.refresh_from_db()
        if not send or (e.status == "unknown" and not e.resendable):
            return False  # held, or an operator decides (resolve_edition)
        publish(e.id, token)
        e.refresh_from_db()
        if e.status in ("unknown", "posting"):
            return False
    return True


# -- collection -------------------------------------------------------------------


def period(m: Monitor, token: str, now: datetime, *, blocked: str | None) -> Edition | None:
    n = m.periods + 1
    scans = [scan_partition(m, token, n, source) for source in m.sources]
    return decide(m.id, token, n, scans, now, blocked=blocked)


def scan_partition(m: Monitor, token: str, n: int, config: dict[str, Any]) -> SourceScan:
    kind = sources.get(str(config.get("kind")))
    name = str(config.get("name") or config.get("url") or config.get("kind"))[:300]
    partition = str(config.get("partition") or "default")
    started = timezone.now()
    if kind is None:
        with transaction.atomic():
            _fenced(m.id, token)
            return SourceScan.objects.create(
                monitor=m,
                period=n,
                source=name,
                partition=partition,
                revision="",
                cutoff=started,
                coverage="failed",
                error=f"definition_missing: no source kind {config.get('kind')!r} in this build",
            )
    revision = kind.revision(config)
    cp = MonitorCheckpoint.objects.filter(monitor=m, source=name, partition=partition, revision=revision).first()
    # The session, for a kind that reaches what the session's profile names (an MCP server); never stored.
    scanning = {**config, SESSION_KEY: str(m.session_id)}
    try:
        result = kind.scan(scanning, cp.value if cp else None, initialized=cp is not None)
    except Exception as exc:
        if is_database_outage(exc):
            raise
        # A source kind's own failure is this partition's failed scan; the others go on.
        logger.exception("monitor %s: scanning %s failed", m.id, name)
        result = sources.Scan(coverage="failed", error=f"the scan failed: {type(exc).__name__}: {exc}")
    failpoints.pause("monitor_scan", FAILPOINT)  # pages read, nothing committed: a crash here loses nothing
    baseline = cp is None and config.get("initial") == "now"
    with transaction.atomic():
        _fenced(m.id, token)
        scan = SourceScan.objects.create(
            monitor=m,
            period=n,
            source=name,
            partition=partition,
            revision=revision,
            prior_checkpoint=cp.value if cp else None,
            cutoff=started,
            boundary=result.boundary if result.coverage == "complete" else None,
            coverage=result.coverage,
            pages=result.pages,
            evidence={**result.evidence, **({"initial": "now: items before it are a baseline"} if baseline else {})},
            error=result.error[:2000],
        )
        added = _candidates(m, name, scan, result.items, status="baseline" if baseline else "pending")
        if added:
            SourceScan.objects.filter(id=scan.id).update(items=added)
            scan.items = added
        if result.coverage == "complete":
            # The checkpoint advances with the candidates it covered, in this one commit.
            MonitorCheckpoint.objects.update_or_create(
                monitor=m,
                source=name,
                partition=partition,
                revision=revision,
                defaults={"value": result.checkpoint, "updated_at": timezone.now()},
            )
    return scan


def _candidates(m: Monitor, source: str, scan: SourceScan, items: list[sources.Item], *, status: str) -> int:
    """New item versions as pending candidates; one already pending, assigned
    or delivered is a duplicate (the overlap, a rescan after a crash)."""
    if not items:
        return 0
    ids = {i.id for i in items}
    known = set(
        MonitorCandidate.objects.filter(monitor=m, source=source, item_id__in=ids).values_list("item_id", "version")
    ) | set(DeliveryLedger.objects.filter(monitor=m, source=source, item_id__in=ids).values_list("item_id", "version"))
    fresh = [i for i in items if (i.id, i.version) not in known]
    MonitorCandidate.objects.bulk_create(
        [
            MonitorCandidate(
                monitor=m,
                source=source,
                item_id=i.id,
                version=i.version,
                title=i.title,
                url=i.url,
                item_time=i.time,
                scan=scan,
                status=status,
            )
            for i in fresh
        ]
    )
    return len(fresh)


def coverage_of(scans: list[SourceScan]) -> list[dict[str, Any]]:
    return [
        {"source": s.source, "partition": s.partition, "coverage": s.coverage, "pages": s.pages, "error": s.error}
        for s in scans
    ]


def item_of(c: MonitorCandidate) -> dict[str, Any]:
    return {"source": c.source, "id": c.item_id, "version": c.version, "title": c.title, "url": c.url}


def digest_of(items: list[dict[str, Any]], coverage: list[dict[str, Any]]) -> str:
    lines = [f"{len(items)} new item(s)."] if items else ["No new items."]
    lines += [f"- {i['title'] or i['id']} {i['url']}".rstrip() for i in items[:50]]
    if len(items) > 50:
        lines.append(f"... and {len(items) - 50} more")
    gaps = [c for c in coverage if c["coverage"] != "complete"]
    for c in gaps:
        lines.append(f"Coverage {c['coverage']}: {c['source']} ({c['partition']}): {c['error']}")
    return "\n".join(lines)


def decide(
    monitor_id: uuid.UUID, token: str, n: int, scans: list[SourceScan], now: datetime, *, blocked: str | None
) -> Edition | None:
    """The period's edition and the monitor's next due time, in one commit."""
    with transaction.atomic():
        m = _fenced(monitor_id, token)
        if m.periods >= n:
            return None  # decided already (a period that raced its own lease)
        kind = destinations.get(str(m.destination.get("kind")))
        coverage = coverage_of(scans)
        incomplete = [c for c in coverage if c["coverage"] != "complete"]
        base: dict[str, Any] = {
            "monitor": m,
            "period": n,
            "destination": kind.key(m.destination) if kind else str(m.destination.get("kind")),
            "scans": [s.id for s in scans],
            "coverage": coverage,
            "resendable": bool(kind and kind.idempotent),
        }
        pending = list(
            MonitorCandidate.objects.filter(monitor=m, status="pending").order_by("item_time", "id")[:MAX_ITEMS]
        )
        if kind is None:
            edition = Edition.objects.create(
                **base, status="held", reason=f"definition_missing: no destination kind {m.destination.get('kind')!r}"
            )
        elif blocked:
            edition = Edition.objects.create(
                **base, status="held", reason=f"{blocked}; {len(pending)} item(s) stay pending"
            )
        elif not pending and not incomplete and m.quiet == "suppress":
            edition = Edition.objects.create(
                **base,
                status="suppressed",
                reason="quiet policy suppress: no new item versions, and every source partition was read completely",
            )
        else:
            items = [item_of(c) for c in pending]
            by_model = m.digest_by == "model" and bool(items)
            edition = Edition.objects.create(
                **base,
                status="prepared",
                items=items,
                digest="" if by_model else digest_of(items, coverage),
                digest_by="" if by_model else "host",
            )
            MonitorCandidate.objects.filter(id__in=[c.id for c in pending]).update(status="assigned", edition=edition)
        m.periods = n
        m.due_at = next_due(m, now)
        m.updated_at = now
        m.save(update_fields=["periods", "due_at", "updated_at"])
    return edition


def next_due(m: Monitor, now: datetime) -> datetime | None:
    """The next due time after this one. A missed run (workers down) runs
    once and keeps the phase; collection resumes from the checkpoint either
    way, so the missed interval is collected, never discarded."""
    if m.misfire == "reschedule" and m.every_seconds:
        grace = timedelta(seconds=settings.TERRET_SCHEDULE_GRACE_SECONDS)
        if m.due_at is not None and m.due_at < now - grace:
            return now + timedelta(seconds=m.every_seconds)
    after = max(now, m.due_at) if m.due_at else now
    return next_after(cast(Schedule, m), after)  # reads cron, every_seconds and due_at alone


# -- publication ------------------------------------------------------------------


def publish(edition_id: uuid.UUID, token: str) -> Edition:
    """Intent, send, receipt: each committed on its own, fenced on the lease."""
    write_digest(edition_id, token)
    with transaction.atomic():
        e = Edition.objects.select_for_update().select_related("monitor").get(id=edition_id)
        m = _fenced(e.monitor_id, token)
        if e.status not in ("prepared", "unknown"):
            return e
        kind = destinations.get(str(m.destination.get("kind")))
        if kind is None:
            e.status, e.reason = "held", f"definition_missing: no destination kind {m.destination.get('kind')!r}"
            e.save(update_fields=["status", "reason"])
            return e
        if kind.local:
            # Nothing external: the event, the confirmation and the ledger commit together.
            e.attempts += 1
            with log.locked(m.session_id) as tx:
                event = tx.append(
                    "monitor/edition",
                    {
                        "monitor_id": str(m.id),
                        "edition_id": str(e.id),
                        "period": e.period,
                        "digest": e.digest,
                        "items": list(e.items),
                    },
                )
                record(e, Confirmed(str(event.seq)))
            Edition.objects.filter(id=e.id).update(attempts=e.attempts)
            return e
        e.status = "posting"
        e.attempts += 1
        e.updated_at = timezone.now()
        e.save(update_fields=["status", "attempts", "updated_at"])
    failpoints.pause("monitor_intent", FAILPOINT)  # the intent committed, nothing sent
    outcome = kind.send(
        m.destination,
        Publication(
            edition_id=str(e.id),
            monitor_id=str(m.id),
            session_id=str(m.session_id),
            period=e.period,
            digest=e.digest,
            items=list(e.items),
            coverage=list(e.coverage),
            secret=m.secret,
        ),
    )
    failpoints.pause("monitor_sent", FAILPOINT)  # sent, the receipt not committed
    with transaction.atomic():
        _fenced(m.id, token)
        e = Edition.objects.select_for_update().get(id=edition_id)
        if e.status != "posting":
            return e
        record(e, outcome)
    return e


DIGEST_PROMPT = (
    "You write the digest of a monitoring job's edition. The host collected the new items listed below and "
    "will deliver exactly those with your digest; do not add, drop or invent items. Write a short digest (at "
    "most 15 lines) for the reader: what is new, grouped where useful. If the coverage notes name a source "
    "that could not be read, say so plainly: it is not 'nothing new'. Reply with the digest only."
)
DIGEST_INPUT_CHARS = 16_000
DIGEST_MAX_CHARS = 8_000


def write_digest(edition_id: uuid.UUID, token: str) -> None:
    """The model writes a prepared edition's digest (the monitor's `digest_by`
    "model"), from the candidates the host selected; outside any transaction.
    The model's reply never changes the items, the coverage or the status; a
    model that fails leaves the host's own digest, and says so."""
    e = Edition.objects.select_related("monitor__session__profile").get(id=edition_id)
    if e.status != "prepared" or e.digest_by:
        return
    session = e.monitor.session
    spec = resolve_spec("main", session.profile, session.id)
    text, by, usage = "", "host", None
    if spec:
        listing = json.dumps(
            {"items": [{k: i[k] for k in ("source", "title", "url")} for i in e.items], "coverage": e.coverage}
        )[:DIGEST_INPUT_CHARS]
        messages = [{"role": "system", "content": DIGEST_PROMPT}, {"role": "user", "content": listing}]
        try:
            reply = complete_utility(spec, messages)
            text, usage = (reply.content or "").strip()[:DIGEST_MAX_CHARS], reply.usage
            by = "model" if text else "host (the model answered nothing)"
        except ModelError as exc:
            by = f"host (the model failed: {exc})"[:120]
    if usage is not None:
        log.append(session.id, "usage/recorded", {"purpose": "digest", "model": spec or "", "usage": usage.as_json()})
    with transaction.atomic():
        _fenced(e.monitor_id, token)
        Edition.objects.filter(id=e.id, status="prepared", digest_by="").update(
            digest=text or digest_of(list(e.items), list(e.coverage)), digest_by=by, updated_at=timezone.now()
        )


def record(e: Edition, outcome: destinations.Outcome) -> None:
    """An edition's outcome and what follows from it; inside the transaction."""
    e.updated_at = timezone.now()
    if isinstance(outcome, Confirmed):
        e.status, e.receipt, e.reason = "confirmed", outcome.receipt, ""
        DeliveryLedger.objects.bulk_create(
            [
                DeliveryLedger(
                    monitor_id=e.monitor_id,
                    source=i["source"],
                    item_id=i["id"],
                    version=i["version"],
                    edition=e,
                    receipt=outcome.receipt,
                )
                for i in e.items
            ]
        )
        MonitorCandidate.objects.filter(edition=e).update(status="delivered")
    elif isinstance(outcome, Failed):
        # Certainly not delivered: its items go back to pending for the next edition.
        e.status, e.reason = "failed", outcome.reason[:2000]
        MonitorCandidate.objects.filter(edition=e, status="assigned").update(status="pending", edition=None)
    else:
        e.status, e.reason = "unknown", outcome.reason[:2000]
    e.save(update_fields=["status", "receipt", "reason", "updated_at"])
