"""A monitor's periods: collection, the edition, its publication.

Every worker's clock thread (runtime/schedules.py, through
runtime.hooks.register_clock) calls `tick()`. A tick claims a monitor that
is due, or that has an edition to settle, by a conditional UPDATE of its
lease (one worker at a time on a monitor, on PostgreSQL and SQLite alike),
and runs it outside any transaction. Every write it then makes is fenced
on that lease (`_fenced`): a worker whose lease expired and was taken over
commits nothing more.

Timing is a schedule's (runtime/schedules.py's timing functions, on the
monitor's own timing fields): a due time past the grace follows the misfire
policy (`skip` runs no period for it, `run_once` runs one and keeps the
phase, `reschedule` runs one and restarts the interval from now), and the
bounds (max_runs, expires_at: the profile's when the request gave none)
complete the monitor. Collection resumes from the checkpoints either way,
so a skipped due time delays items, never drops them.

Phases, each its own commit, so a crash (kill -9) between any two loses
nothing and sends nothing twice:

1. settle: every open edition, oldest first, goes through `publish`, where
   the effect ledger decides (below). Nothing else is sent while one is
   unresolved: later periods still collect, and their editions are `held`.
2. scan, per source partition: the pages are read first, then the scan's
   record, its new candidates (item versions neither pending nor delivered)
   and, for a complete scan only, the advanced checkpoint commit together.
   A crash mid-scan commits nothing: the next run rescans.
3. decide: the period's edition (prepared, suppressed, or held) with the
   pending candidates it takes, and the monitor's next due time, in one
   commit.
4. publish, through the session's effect ledger (runtime/effects.py): the
   send is a host effect, call `edition-<id>`, its idempotency key the
   edition id. `next_move` over that call's ledger decides, as it does for a
   tool call: the intent (tool/attempt) commits with the edition's
   `posting`, before the send; the destination's receipt (tool/receipt)
   with the edition's confirmation and delivered entries, or its failure;
   an unknown outcome is a tool/unknown with the edition's `unknown`. An
   attempt whose worker died mid-send is re-sent under the same key to a
   destination that honours it (replay `safe`), and marked unknown at any
   other (`never`). An unknown send waits for the existing effect
   resolution (services/effects.py: rerun, done with the receipt, failed),
   except that the host resolves it `rerun` itself, after
   TERRET_MONITOR_RESEND_SECONDS, at a destination that honours the key.
   It holds this monitor's later sends only: it is counted in the session's
   unresolved_effects (/ops/, /metrics), not its unknown_effects, so the
   session's own turns never wait on it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import EffectNotPending, InvalidInput, LeaseLost
from sessions_app.llm.registry import complete_utility
from sessions_app.llm.types import ModelError
from sessions_app.models import (
    DeliveryLedger,
    Edition,
    Monitor,
    MonitorCandidate,
    MonitorCheckpoint,
    Session,
    SourceScan,
)
from sessions_app.monitors import destinations, sources
from sessions_app.monitors.destinations import Confirmed, Failed, Publication, Unknown
from sessions_app.monitors.sources.mcp import SESSION_KEY
from sessions_app.runtime import effects, failpoints, limits
from sessions_app.runtime.effects import AwaitOperator, CallLedger, Move, Run, Settled
from sessions_app.runtime.failures import is_database_outage
from sessions_app.runtime.roles import resolve_spec
from sessions_app.runtime.schedules import (
    OWNER_INACTIVE,
    bound_reached,
    due_now,
    ends_after_run,
    next_due_after_run,
    next_due_after_skip,
)
from sessions_app.tools.base import Definition, ToolContext

logger = logging.getLogger(__name__)

OPEN = ("prepared", "posting", "unknown")
MAX_ITEMS = 500  # an edition's items; more wait, pending, for the next
ROUND = 10  # monitors one tick runs at most
FAILPOINT = "monitor"
RETRY_SECONDS = 60  # a period that failed on an unexpected error is tried again after this
SETTLING = ("active", "completed")  # the monitors whose open editions the clock settles
SEND_TOOL = "monitor.publish"  # a send's name in the effect ledger
HOST = "terret"  # who resolves an unknown send `rerun` when its destination honours the Idempotency-Key
_WORKER = f"{socket.gethostname()}:{os.getpid()}"


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
    # A completed monitor (a bound reached) still settles its last editions; a cancelled one does not.
    work = Q(status="active", due_at__lte=now) | Q(status__in=SETTLING, id__in=settle)
    ids = list(
        Monitor.objects.filter(free)
        .filter(work)
        .exclude(id__in=seen)
        .order_by("due_at")
        .values_list("id", flat=True)[:ROUND]
    )
    for mid in ids:
        token = secrets.token_hex(8)
        took = (
            Monitor.objects.filter(free, id=mid)
            .filter(work)
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
    if m.status == "completed":
        if stop is None:
            settle(m, token, send=held(m.session) is None, now=now)
        return
    ended = bound_reached(m, m.periods, now)
    if stop is not None or ended is not None:
        status, reason = ("cancelled", stop) if stop is not None else ("completed", ended)
        with transaction.atomic():
            _fenced(m.id, token)
            Monitor.objects.filter(id=m.id).update(status=status, status_reason=reason, due_at=None, updated_at=now)
        return
    hold = held(m.session)
    # Under a hold (an operator's suspension, a budget) nothing is sent, not even a reconciling re-send;
    # collection goes on and the period's edition is held.
    period_due = m.due_at is not None and m.due_at <= now
    # A period due now re-sends an unknown edition at once; a claim to settle only waits out the resend delay.
    settled = settle(m, token, send=hold is None, now=now, eager=period_due) and hold is None
    if period_due:
        due = due_now(m, now)  # the misfire policy, exactly as a schedule's
        if not due.run:
            skip(m.id, token, now, due.reason)
            return
        blocked = hold or (
            None if settled else "an earlier edition's outcome is unknown: it is reconciled before any other send"
        )
        edition = period(m, token, now, blocked=blocked)
        if edition is not None and edition.status == "prepared":
            publish(edition.id, token, now=now)


def skip(monitor_id: uuid.UUID, token: str, now: datetime, reason: str) -> None:
    """A due time the misfire policy skips: no period, the next due time as a schedule's skip sets it.
    Collection resumes from the checkpoints at the next period: the skipped interval is collected then."""
    with transaction.atomic():
        m = _fenced(monitor_id, token)
        if m.due_at is None or m.due_at > now:
            return  # moved on already
        m.due_at = next_due_after_skip(m, now)
        m.status_reason, m.updated_at = f"skipped a due time: {reason}"[:300], now
        m.save(update_fields=["due_at", "status_reason", "updated_at"])


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


def settle(m: Monitor, token: str, *, send: bool = True, now: datetime | None = None, eager: bool = False) -> bool:
    """Settle open editions, oldest first, each as the effect ledger decides
    (`publish`); False while one stays open (nothing else may be sent then).
    Without `send` (a hold) nothing goes out, but what needs no send is
    still recorded (an attempt that may not be re-sent is marked unknown)."""
    for e in Edition.objects.filter(monitor=m, status__in=OPEN).order_by("period"):
        if publish(e.id, token, send=send, now=now, eager=eager).status in OPEN:
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
        # The next due time as a schedule's after a run; the bounds end the monitor as they end a schedule.
        nxt = None if m.max_runs is not None and n >= m.max_runs else next_due_after_run(m, now)
        ends = ends_after_run(m, n, nxt)
        m.due_at = None if ends else nxt
        if ends:
            m.status, m.status_reason = "completed", ends
        m.updated_at = now
        m.save(update_fields=["periods", "due_at", "status", "status_reason", "updated_at"])
    return edition


# -- publication, through the effect ledger -------------------------------------


def call_id(edition_id: uuid.UUID | str) -> str:
    """An edition's send in the effect ledger: one call, every attempt of it."""
    return f"edition-{edition_id}"


def _not_a_tool(ctx: ToolContext, args: dict[str, Any]) -> str:
    raise RuntimeError("a monitor's send is carried out by the monitor's clock, never called as a tool")


def send_definition(kind: destinations.Kind | None) -> Definition:
    """The send as the ledger's replay decision (effects.next_move) reads it:
    re-sending under the same Idempotency-Key is `safe` at a destination
    that honours the key; at any other (or one this build lacks) a repeat is
    never assumed harmless."""
    idempotent = kind is not None and kind.idempotent
    return Definition(
        SEND_TOOL,
        "a monitor's send of an edition",
        {},
        _not_a_tool,
        mutating=True,
        idempotent=idempotent,
        replay="safe" if idempotent else "never",
    )


def publish(
    edition_id: uuid.UUID, token: str, *, send: bool = True, now: datetime | None = None, eager: bool = False
) -> Edition:
    """Carry out what the effect ledger says of the edition's send: its
    intent, the send and the receipt (each committed on its own, fenced on
    the lease, under the session's row lock), or the outcome already on
    record (an operator's answer), or an unknown outcome. Locks, in this
    order everywhere: the monitor, the session, the edition."""
    now = now or timezone.now()
    if send:
        write_digest(edition_id, token)
    monitor_id = Edition.objects.filter(id=edition_id).values_list("monitor_id", flat=True).get()
    with transaction.atomic():
        m = _fenced(monitor_id, token)
        kind = destinations.get(str(m.destination.get("kind")))
        with log.locked(m.session_id) as tx:
            e = Edition.objects.select_for_update().get(id=edition_id)
            if e.status not in OPEN:
                return e
            if kind is None:
                e.status, e.reason = "held", f"definition_missing: no destination kind {m.destination.get('kind')!r}"
                e.save(update_fields=["status", "reason"])
                return e
            if kind.local:
                if send:
                    _publish_locally(tx, m, e)
                return e
            defn = send_definition(kind)
            ledger = effects.call_ledger(tx.session_id, call_id(e.id))
            if send and _resend_due(e, ledger, defn, None if eager else now):
                # The destination honours the key: the host answers its own unknown send with a re-send.
                _resolution(tx, e, ledger, "rerun", HOST, reason="the destination honours Idempotency-Key")
                ledger = effects.call_ledger(tx.session_id, call_id(e.id))
            move = effects.next_move(ledger, defn)
            if not isinstance(move, Run):
                carry_out(tx, e, move)
                return e
            if not send:
                return e  # a hold: the re-send waits for it to lift
            intent: dict[str, Any] = {
                "call_id": call_id(e.id),
                "name": SEND_TOOL,
                "attempt": move.number,
                "idempotency_key": str(e.id),
                "replay": defn.replay_policy,
                "fence": 0,  # no session lease: the monitor's own lease fences every write here
                "worker": _WORKER,
                "edition_id": str(e.id),
                "monitor_id": str(m.id),
            }
            if move.replaces is not None:
                intent.update(replaces=move.replaces, why=move.why)
            tx.append("tool/attempt", intent)
            e.status, e.attempts, e.updated_at = "posting", move.number, timezone.now()
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
        with log.locked(m.session_id) as tx:
            e = Edition.objects.select_for_update().get(id=edition_id)
            ledger = effects.call_ledger(tx.session_id, call_id(e.id))
            last = ledger.last if ledger else None
            if e.status != "posting" or last is None or last.number != move.number or last.state != "in_flight":
                return e  # settled meanwhile
            _outcome(tx, e, move.number, outcome)
    return e


def _publish_locally(tx: log.SessionTx, m: Monitor, e: Edition) -> None:
    """The session destination: nothing external, so no outcome to be unsure
    of: the event, the confirmation and the ledger commit together."""
    e.attempts += 1
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


def _resend_due(e: Edition, ledger: CallLedger | None, defn: Definition, now: datetime | None) -> bool:
    """Whether the host re-sends an unknown send itself: only to a destination that honours the key, and
    (`now` given) once TERRET_MONITOR_RESEND_SECONDS passed since it became unknown."""
    last = ledger.last if ledger else None
    return (
        last is not None
        and last.state == "unknown"
        and defn.replay_policy == "safe"
        and (now is None or e.updated_at <= now - timedelta(seconds=resend_seconds()))
    )


def _resolution(
    tx: log.SessionTx, e: Edition, ledger: CallLedger | None, action: str, by: str, *, reason: str = ""
) -> None:
    last = ledger.last if ledger else None
    assert last is not None
    data = {"call_id": call_id(e.id), "attempt": last.number, "action": action, "by": by, "edition_id": str(e.id)}
    if reason:
        data["reason"] = reason
    tx.append("tool/resolved", data)


def _outcome(tx: log.SessionTx, e: Edition, attempt: int, outcome: destinations.Outcome) -> None:
    """The ledger entry of a send's outcome and the edition's, in one commit."""
    base = {"call_id": call_id(e.id), "name": SEND_TOOL, "attempt": attempt, "edition_id": str(e.id)}
    if isinstance(outcome, Confirmed):
        tx.append("tool/receipt", {**base, "content": outcome.receipt, "receipt": outcome.receipt})
    elif isinstance(outcome, Failed):
        tx.append("tool/receipt", {**base, "content": outcome.reason[:2000], "is_error": True})
    else:
        tx.append("tool/unknown", {**base, "reason": outcome.reason[:2000]})
    record(e, outcome)


def carry_out(tx: log.SessionTx, e: Edition, move: Move) -> None:
    """A move that sends nothing, onto the edition (locked, under the session's
    lock): an outcome on record (an operator's, or the attempt's own), an
    attempt to mark unknown, or one that waits for an operator. A Run (a
    re-send) is left to the clock: the edition is made `prepared` again."""
    if isinstance(move, Settled):
        if move.via is None:
            ledger = effects.call_ledger(tx.session_id, call_id(e.id))
            result = (ledger.last.result if ledger and ledger.last else None) or {}
            content, failed = str(result.get("content", "")), bool(result.get("is_error"))
        else:
            content, failed = move.content, move.is_error
        record(e, Failed(content) if failed else Confirmed(content[:300]))
    elif isinstance(move, AwaitOperator):
        if move.reason is not None:
            why = f"the worker posting it stopped before the receipt: {move.reason}"
            unknown = {"call_id": call_id(e.id), "name": SEND_TOOL, "attempt": move.attempt, "edition_id": str(e.id)}
            tx.append("tool/unknown", {**unknown, "reason": why})
            record(e, Unknown(why))
        elif e.status != "unknown":
            record(e, Unknown(e.reason or "the outcome is unknown: it waits for an operator"))
    elif isinstance(move, Run):
        e.status, e.updated_at = "prepared", timezone.now()
        e.save(update_fields=["status", "updated_at"])


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


# -- an operator's answer (services/effects.py resolve) ----------------------------


def check_resolution(edition_id: str, action: str, result: str) -> None:
    """What an answer about an edition's unknown send must hold, before it is
    appended: done names the destination's receipt (a confirmation needs an
    identity), and a rerun needs a monitor whose clock still sends."""
    if action == "done" and not (result.strip() and len(result) <= 300):
        raise InvalidInput("done needs the destination's receipt as result (1..300 characters)")
    if action == "rerun":
        status = Edition.objects.filter(id=edition_id).values_list("monitor__status", flat=True).first()
        if status not in SETTLING:
            raise EffectNotPending(f"the monitor is {status}: nothing would send it again; mark it done or failed")


def resolved(tx: log.SessionTx, edition_id: str, action: str, by: str, reason: str = "") -> Edition:
    """The edition after an answer appended in `tx` (tool/resolved): the
    ledger's move (next_move, as the clock reads it) carried onto it. done:
    confirmed, with delivered entries; failed: its items back to pending for
    the next edition; rerun: `prepared`, for the clock to send again under
    the same key."""
    e = Edition.objects.select_for_update().select_related("monitor").get(id=edition_id)
    defn = send_definition(destinations.get(str(e.monitor.destination.get("kind"))))
    carry_out(tx, e, effects.next_move(effects.call_ledger(tx.session_id, call_id(e.id)), defn))
    if action in ("done", "failed"):
        e.reason = f"resolved {action} by {by}" + (f": {reason}" if reason else "")
        if action == "failed" and e.status == "failed":
            e.reason += " (its items go to the next edition)"
        e.save(update_fields=["reason"])
    else:
        e.reason = f"re-send under the same Idempotency-Key asked by {by}"
        e.save(update_fields=["reason"])
    return e
