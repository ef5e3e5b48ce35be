"""The Prometheus endpoint, `/metrics`: every figure read from the database
at scrape time.

Turns run in Celery worker processes, several of them and possibly on other
hosts, and the web process that answers a scrape runs none of them. A
process-local counter (prometheus-client's default) would count only what
the answering process did, and multiprocess mode's files only what the
processes of one host did; both would be wrong. The database is the one
truth every process shares, so `DatabaseCollector` keeps no state: each
scrape runs a handful of bounded queries and reports what they find.

- Gauges come from the session rows' projections, which the log's append
  keeps in step with the events (one query for the sessions by status, live
  turns, blocked and stalled turns, held input and pending approvals), and one indexed
  read of the events for the oldest approval still unanswered.
- Counters come from per-UTC-day tallies that the log's append statement
  itself keeps (sessions_app/log/catalogue.py, `Kind.extra`): UsageDay
  (steps, tokens, cost, turns started, per profile), TurnTally (turns ended
  by status and budget reason), ModelTally (model requests, tokens, cost and latency by model), summed
  over the days; and RuntimeCounter, incremented with one atomic upsert by
  whatever worker process does the thing (a sweep round). A counter drops
  only when an agent profile is deleted with its tallies, which Prometheus
  reads as a counter reset.

Every label value is bounded: statuses and budget reasons are enums, and
profiles and models are what operators configure.

Access: a staff session, or `Authorization: Bearer <TERRET_METRICS_TOKEN>`
(unset: token access is off). No credentials: 401; others: 403. GET only.
See docs/metrics.md.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.db.models import BigIntegerField, Count, Exists, IntegerField, Max, Min, OuterRef, Q, Subquery, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from sessions_app.models import (
    EDITION_STATUSES,
    NOTIFY_STATUSES,
    SCAN_COVERAGE,
    ColdSegment,
    DeliveryLedger,
    Edition,
    EffectAudit,
    Event,
    ModelTally,
    Notification,
    RuntimeCounter,
    Session,
    SourceScan,
    Task,
    TurnTally,
    UsageDay,
    WorkerProcess,
)
from sessions_app.runtime.progress import STALL_STANDS

# Session.status's precedence, written as conditions on the projection columns.
_OPEN = Q(open_turn_seq__isnull=False)
_NOT_REVOKED = _OPEN & Q(revoked_seq__isnull=True)
_NOT_SUSPENDED = _NOT_REVOKED & Q(suspended_seq__isnull=True)
_NOT_BLOCKED = _NOT_SUSPENDED & Q(blocked_seq__isnull=True)
_NO_UNKNOWN = _NOT_BLOCKED & Q(unknown_effects__lte=0)
STATUS_FILTERS: dict[str, Q] = {
    "idle": Q(open_turn_seq__isnull=True),
    "revoked": _OPEN & Q(revoked_seq__isnull=False),
    "suspended": _NOT_REVOKED & Q(suspended_seq__isnull=False),
    "blocked": _NOT_SUSPENDED & Q(blocked_seq__isnull=False),
    "waiting_reconcile": _NOT_BLOCKED & Q(unknown_effects__gt=0),
    "waiting_approval": _NO_UNKNOWN & Q(pending_approvals__gt=0),
    "running": _NO_UNKNOWN & Q(pending_approvals__lte=0),
}
# The counters kept in RuntimeCounter, by row name: (metric, help).
RUNTIME_COUNTERS = {
    "sweeps": ("terret_sweeps", "Sweep rounds run by worker processes (runtime/sweep.py)."),
    "lease_takeovers": (
        "terret_lease_takeovers",
        "Turns re-entered mid-step by a drive after their worker stopped (a crash, a lost lease, a deploy).",
    ),
    "queue_waits": ("terret_queue_waits", "Drive tasks taken by a worker (the count for terret_queue_wait_seconds)."),
    "effects_audits": (
        "terret_effects_audits",
        "Effect ledgers of sessions audited by the sweep (runtime/effects.py).",
    ),
    "effects_audit_findings": (
        "terret_effects_audit_findings",
        "Problems found by the sweep's effect audits, every audit counted (a problem seen twice counts twice).",
    ),
}


def _int(value: object) -> int:
    return int(value or 0)  # type: ignore[call-overload]


def _profile(name: str | None) -> str:
    return name or ""


class DatabaseCollector(Collector):
    """Reads every figure from the database on each `collect` (see the module docstring)."""

    def collect(self) -> Iterable[Metric]:
        now = timezone.now()
        yield from self._sessions(now)
        yield self._versions()
        yield from self._storage()
        yield self._oldest_approval(now)
        yield from self._turns()
        yield from self._usage()
        yield from self._models()
        yield from self._runtime()
        yield from self._effects_audit()
        yield self._notifications()
        yield from self._monitors()
        yield self._tasks()

    def _tasks(self) -> Metric:
        rows = Task.objects.values_list("kind", "phase").annotate(n=Count("pk")).order_by("kind", "phase")
        by_phase = GaugeMetricFamily(
            "terret_tasks",
            "Owned tasks by kind and phase (runtime/owned/): live phases are pending, running, waiting, "
            "completing and blocked; done, failed and cancelled have their terminal receipt.",
            labels=["kind", "phase"],
        )
        for kind, phase, n in rows:
            by_phase.add_metric([kind, phase], _int(n))
        return by_phase

    def _effects_audit(self) -> Iterable[Metric]:
        audit = EffectAudit.objects.filter(found__gt=0).aggregate(
            sessions=Count("pk"), problems=Coalesce(Sum("found"), 0, output_field=IntegerField())
        )
        yield GaugeMetricFamily(
            "terret_effects_audit_problems",
            "Problems the sweep's effect audit found in the latest audit of each session (runtime/effects.py).",
            _int(audit["problems"]),
        )
        yield GaugeMetricFamily(
            "terret_effects_audit_sessions",
            "Sessions whose latest effect audit found a problem.",
            _int(audit["sessions"]),
        )

    def _sessions(self, now: datetime) -> Iterable[Metric]:
        live = _OPEN & ~Q(lease_owner="") & Q(lease_expires_at__gt=now)
        row = Session.objects.aggregate(
            **{f"s_{name}": Count("pk", filter=cond) for name, cond in STATUS_FILTERS.items()},
            live=Count("pk", filter=live),
            blocked=Count("pk", filter=_OPEN & Q(blocked_seq__isnull=False)),
            stalled=Count("pk", filter=STALL_STANDS),
            held=Count("pk", filter=Q(held_seq__isnull=False)),
            approvals=Coalesce(Sum("pending_approvals", filter=_OPEN), 0, output_field=IntegerField()),
            unresolved=Coalesce(Sum("unresolved_effects"), 0, output_field=IntegerField()),
            unknown_open=Coalesce(Sum("unknown_effects", filter=_OPEN), 0, output_field=IntegerField()),
        )
        by_status = GaugeMetricFamily("terret_sessions", "Sessions by status (Session.status).", labels=["status"])
        for name in STATUS_FILTERS:
            by_status.add_metric([name], _int(row[f"s_{name}"]))
        yield by_status
        yield GaugeMetricFamily(
            "terret_turns_live", "Open turns whose lease a worker holds and has not let expire.", _int(row["live"])
        )
        yield GaugeMetricFamily(
            "terret_turns_blocked",
            "Open turns stopped by turn/blocked, waiting for a stimulus or an operator (whatever else holds them).",
            _int(row["blocked"]),
        )
        yield GaugeMetricFamily(
            "terret_turns_stalled",
            "Running turns with no progress (no event, no streamed text) for TERRET_STALL_SECONDS, whose "
            "turn/stalled stands.",
            _int(row["stalled"]),
        )
        yield GaugeMetricFamily(
            "terret_sessions_held", "Sessions whose input a budget or a hold keeps (input/held).", _int(row["held"])
        )
        yield GaugeMetricFamily(
            "terret_approvals_pending", "Tool calls of open turns waiting for a reviewer.", _int(row["approvals"])
        )
        yield GaugeMetricFamily(
            "terret_effects_unknown",
            "Attempts of unknown outcome no operator has resolved yet, of open and ended turns alike.",
            _int(row["unresolved"]),
        )
        yield GaugeMetricFamily(
            "terret_effects_unknown_ended",
            "Of those, the attempts of turns that have ended (cancelled or failed around them).",
            max(_int(row["unresolved"]) - _int(row["unknown_open"]), 0),
        )

    def _storage(self) -> Iterable[Metric]:
        """The log's size (Session.log_bytes, kept by every append) by profile
        and tier, cold archives' stored bytes, and the largest session. Per
        session only as the largest: a label per session would be unbounded
        (the admin's session list shows each one's bytes)."""
        events = GaugeMetricFamily(
            "terret_log_events", "Events in the logs, hot and cold, by profile and tier.", labels=["profile", "tier"]
        )
        nbytes = GaugeMetricFamily(
            "terret_log_bytes",
            "UTF-8 bytes of the logs' event payloads, by profile and tier (docs/storage.md).",
            labels=["profile", "tier"],
        )
        rows = (
            Session.objects.values("profile__name", "storage_tier")
            .annotate(
                n_events=Coalesce(Sum("last_seq"), 0, output_field=BigIntegerField()),
                nbytes=Coalesce(Sum("log_bytes"), 0, output_field=BigIntegerField()),
            )
            .order_by("profile__name", "storage_tier")
        )
        for r in rows:
            labels = [_profile(r["profile__name"]), r["storage_tier"]]
            events.add_metric(labels, _int(r["n_events"]))
            nbytes.add_metric(labels, _int(r["nbytes"]))
        yield events
        yield nbytes
        stored = GaugeMetricFamily(
            "terret_cold_stored_bytes",
            "Compressed bytes of the cold sessions' archives (ColdSegment), by profile.",
            labels=["profile"],
        )
        cold = (
            ColdSegment.objects.filter(deleted_at__isnull=True)
            .values("session__profile__name")
            .annotate(n=Coalesce(Sum("stored_bytes"), 0, output_field=BigIntegerField()))
            .order_by("session__profile__name")
        )
        for c in cold:
            stored.add_metric([_profile(c["session__profile__name"])], _int(c["n"]))
        yield stored
        largest = Session.objects.aggregate(m=Max("log_bytes"))["m"]
        yield GaugeMetricFamily(
            "terret_log_bytes_largest_session", "The largest session's log, in payload bytes.", _int(largest)
        )

    def _versions(self) -> Metric:
        gauge = GaugeMetricFamily(
            "terret_sessions_by_version",
            "Sessions by profile and the agent version they run under (Session.agent_version).",
            labels=["profile", "version"],
        )
        rows = (
            Session.objects.filter(agent_version__isnull=False)
            .values("profile__name", "agent_version")
            .annotate(n=Count("pk"))
            .order_by("profile__name", "agent_version")
        )
        for r in rows:
            gauge.add_metric([_profile(r["profile__name"]), str(r["agent_version"])], _int(r["n"]))
        return gauge

    def _oldest_approval(self, now: datetime) -> Metric:
        answered = Event.objects.filter(
            session_id=OuterRef("session_id"),
            kind="approval/resolved",
            seq__gt=OuterRef("seq"),
            data__call_id=OuterRef("data__call_id"),
        )
        # An expiry that denied settled its request (approval/expired names it by seq).
        expired = (
            Event.objects.filter(
                session_id=OuterRef("session_id"),
                kind="approval/expired",
                seq__gt=OuterRef("seq"),
                data__on_expiry="deny",
            )
            .alias(request_seq=Cast(KT("data__request_seq"), BigIntegerField()))
            .filter(request_seq=OuterRef("seq"))
        )
        # Driven from the (few) sessions waiting on a reviewer, one indexed
        # lookup each on (session, kind, seq): never a scan of the events.
        first_open = (
            Event.objects.filter(
                session_id=OuterRef("pk"), kind="approval/requested", seq__gte=OuterRef("open_turn_seq")
            )
            .exclude(Exists(answered))
            .exclude(Exists(expired))
            .order_by("seq")
            .values("created_at")[:1]
        )
        oldest = (
            Session.objects.filter(_OPEN, pending_approvals__gt=0)
            .annotate(first=Subquery(first_open))
            .aggregate(at=Min("first"))["at"]
        )
        age = max((now - oldest).total_seconds(), 0.0) if oldest else 0.0
        return GaugeMetricFamily(
            "terret_approval_oldest_age_seconds",
            "Age of the oldest approval request still unanswered in an open turn (0: none).",
            age,
        )

    def _turns(self) -> Iterable[Metric]:
        ended = CounterMetricFamily(
            "terret_turns_ended",
            "Turns ended, by status and the budget that ended them ('' for none).",
            labels=["status", "reason"],
        )
        rows = TurnTally.objects.values("status", "reason").annotate(n=Sum("count")).order_by("status", "reason")
        for r in rows:
            ended.add_metric([r["status"], r["reason"]], _int(r["n"]))
        yield ended

    def _usage(self) -> Iterable[Metric]:
        rows = (
            UsageDay.objects.values("profile__name")
            .annotate(
                steps=Sum("steps"),
                unpriced=Sum("unpriced_entries"),
                prompt=Sum("prompt_tokens"),
                completion=Sum("completion_tokens"),
                cost=Sum("cost"),
                turns=Sum("turns"),
            )
            .order_by("profile__name")
        )
        labels = ["profile"]
        tokens = CounterMetricFamily(
            "terret_tokens", "Model tokens used, by profile and kind.", labels=["profile", "kind"]
        )
        cost = CounterMetricFamily("terret_cost_usd", "Priced model spend in USD, by profile.", labels=labels)
        steps = CounterMetricFamily("terret_steps", "Steps run, by profile.", labels=labels)
        unpriced = CounterMetricFamily(
            "terret_unpriced_entries", "Model requests with no price (not counted in cost), by profile.", labels=labels
        )
        turns = CounterMetricFamily("terret_turns_started", "Turns opened, by profile.", labels=labels)
        for r in rows:
            p = _profile(r["profile__name"])
            tokens.add_metric([p, "prompt"], _int(r["prompt"]))
            tokens.add_metric([p, "completion"], _int(r["completion"]))
            cost.add_metric([p], float(r["cost"] or 0))
            steps.add_metric([p], _int(r["steps"]))
            unpriced.add_metric([p], _int(r["unpriced"]))
            turns.add_metric([p], _int(r["turns"]))
        yield from (tokens, cost, steps, unpriced, turns)

    def _models(self) -> list[Metric]:
        requests = CounterMetricFamily(
            "terret_model_requests",
            "Main-role model requests that returned a reply (step/end), by model and profile.",
            labels=["model", "profile"],
        )
        tokens = CounterMetricFamily(
            "terret_model_tokens", "Tokens spent, by model, profile and kind.", labels=["model", "profile", "kind"]
        )
        cost = CounterMetricFamily(
            "terret_model_cost_usd", "Priced cost, by model and profile.", labels=["model", "profile"]
        )
        latency = CounterMetricFamily(
            "terret_model_latency_seconds", "Wall time of timed model requests, by model.", labels=["model"]
        )
        timed = CounterMetricFamily(
            "terret_model_timed_requests", "Model requests with a latency, by model.", labels=["model"]
        )
        rows = ModelTally.objects.values("model", "profile__name").annotate(
            n=Sum("requests"),
            p=Sum("prompt_tokens"),
            c=Sum("completion_tokens"),
            usd=Sum("cost"),
            ms=Sum("latency_ms"),
            t=Sum("timed"),
        )
        by_model: dict[str, list[int]] = {}
        for r in rows.order_by("model", "profile__name"):
            labels = [r["model"], _profile(r["profile__name"])]
            requests.add_metric(labels, _int(r["n"]))
            tokens.add_metric([*labels, "prompt"], _int(r["p"]))
            tokens.add_metric([*labels, "completion"], _int(r["c"]))
            cost.add_metric(labels, float(r["usd"] or 0))
            seen = by_model.setdefault(r["model"], [0, 0])
            seen[0] += _int(r["ms"])
            seen[1] += _int(r["t"])
        for model, (ms, n) in by_model.items():
            latency.add_metric([model], ms / 1000)
            timed.add_metric([model], n)
        return [requests, tokens, cost, latency, timed]

    def _runtime(self) -> Iterable[Metric]:
        values = dict(RuntimeCounter.objects.filter(name__in=RUNTIME_COUNTERS).values_list("name", "value"))
        values.update(RuntimeCounter.objects.filter(name="queue_wait_ms").values_list("name", "value"))
        for key, (name, doc) in RUNTIME_COUNTERS.items():
            yield CounterMetricFamily(name, doc, _int(values.get(key)))
        yield CounterMetricFamily(
            "terret_queue_wait_seconds",
            "Time from a wake-up's send to a worker taking it, summed (divide by terret_queue_waits_total).",
            _int(values.get("queue_wait_ms")) / 1000,
        )
        yield GaugeMetricFamily(
            "terret_worker_processes",
            "Worker processes registered with a liveness lock.",
            WorkerProcess.objects.count(),
        )

    def _notifications(self) -> Metric:
        rows = dict(Notification.objects.values_list("status").annotate(n=Count("pk")).order_by("status"))
        by_status = GaugeMetricFamily(
            "terret_notifications",
            "Notification outbox rows by state (docs/notifications.md); failed and unknown ones wait for an operator.",
            labels=["status"],
        )
        for status in NOTIFY_STATUSES:
            by_status.add_metric([status], _int(rows.get(status)))
        return by_status

    def _monitors(self) -> Iterable[Metric]:
        editions = dict(Edition.objects.values_list("status").annotate(n=Count("pk")).order_by("status"))
        by_status = GaugeMetricFamily(
            "terret_monitor_editions",
            "Monitors' editions by status (docs/protocol.md, Monitors): unknown and held ones need attention.",
            labels=["status"],
        )
        for status in EDITION_STATUSES:
            by_status.add_metric([status], _int(editions.get(status)))
        yield by_status
        yield CounterMetricFamily(
            "terret_monitor_items_delivered",
            "Item versions delivered by confirmed editions (the delivery ledger's entries).",
            DeliveryLedger.objects.count(),
        )
        scans = dict(SourceScan.objects.values_list("coverage").annotate(n=Count("pk")).order_by("coverage"))
        by_coverage = CounterMetricFamily(
            "terret_monitor_scans", "Monitors' source scans by coverage.", labels=["coverage"]
        )
        for coverage in SCAN_COVERAGE:
            by_coverage.add_metric([coverage], _int(scans.get(coverage)))
        yield by_coverage


REGISTRY = CollectorRegistry()
REGISTRY.register(DatabaseCollector())


def _token_ok(request: HttpRequest) -> bool | None:
    """None: no bearer token offered; else whether it is the metrics token."""
    header = request.headers.get("Authorization", "")
    scheme, _, offered = header.partition(" ")
    if scheme.lower() != "bearer" or not offered.strip():
        return None
    expected: str = getattr(settings, "TERRET_METRICS_TOKEN", "") or ""
    if not expected:
        return False
    return hmac.compare_digest(offered.strip().encode(), expected.encode())


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    user = request.user
    token = _token_ok(request)
    allowed = token is True or (user.is_authenticated and user.is_active and user.is_staff)
    if not allowed:
        if token is None and not user.is_authenticated:
            response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    response = HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
