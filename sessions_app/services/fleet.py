"""The live fleet view's reads (/ops/): the turns running now, the session
table with its status filters and sorting, and one session's timeline as a
compact readable history. Every read is bounded; the operators' console
(actions/operators.py) checks who may ask."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from sessions_app.log.reads import events_page
from sessions_app.models import Event, Session
from sessions_app.runtime.progress import RUNNING, turn_progress
from sessions_app.services.usage import USAGE_KINDS, Totals, entry_totals, totals_of

RUNNING_LIMIT = 50
TABLE_LIMIT = 100
TIMELINE_PAGE = 200
SUMMARY_CHARS = 160

# The session table's filters: name -> (label, the rows). In Session.status's order of precedence.
FILTERS: dict[str, tuple[str, Q]] = {
    "all": ("all", Q()),
    "running": ("running", RUNNING),
    "waiting_approval": (
        "waiting for approval",
        Q(open_turn_seq__isnull=False, pending_approvals__gt=0, unknown_effects=0, blocked_seq__isnull=True),
    ),
    "blocked": ("blocked", Q(open_turn_seq__isnull=False, blocked_seq__isnull=False)),
    "held": ("held input", Q(held_seq__isnull=False)),
    "suspended": ("suspended", Q(suspended_seq__isnull=False)),
    "revoked": ("revoked", Q(revoked_seq__isnull=False)),
    "idle": ("idle", Q(open_turn_seq__isnull=True, held_seq__isnull=True, revoked_seq__isnull=True)),
}
# The session table's sort orders: name -> (label, order_by).
SORTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "recent": ("last activity", ("-last_event_at", "-created_at")),
    "oldest": ("oldest activity", ("last_event_at", "created_at")),
    "cost": ("cost", ("-cost", "-last_event_at")),
    "events": ("events", ("-last_seq", "-last_event_at")),
    "title": ("title", ("title", "created_at")),
}


@dataclass(frozen=True)
class LiveTurn:
    """One turn running now: where it is (model call or tool), since when, and what it cost so far."""

    session_id: str
    title: str
    owner: str
    profile: str
    doing: str
    started_at: datetime | None
    cost: Totals

    @property
    def seconds(self) -> int:
        return int((timezone.now() - self.started_at).total_seconds()) if self.started_at else 0

    def as_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "title": self.title,
            "doing": self.doing,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "seconds": self.seconds,
            "cost": self.cost.cost_display,
        }


def running_now() -> list[LiveTurn]:
    """Every running turn (Session.status running), the longest-running first."""
    rows = Session.objects.filter(RUNNING).select_related("owner", "profile").order_by("open_turn_seq", "created_at")
    sessions = list(rows[:RUNNING_LIMIT])
    return [_live_turn(s) for s in sessions]


def _live_turn(session: Session) -> LiveTurn:
    turn_seq = session.open_turn_seq or 0
    progress = turn_progress(session)
    step = (
        Event.objects.filter(session=session, seq__gte=turn_seq, kind="step/start")
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    if progress.tools_in_flight:
        doing = "tool " + ", ".join(t.name for t in progress.tools_in_flight)
    elif progress.phase == "model":
        doing = f"model call, step {(step or {}).get('step', '?')}"
        if progress.streamed_tokens:
            doing += f" ({progress.streamed_tokens} chunks streamed)"
    else:
        doing = "between steps" if step else "starting"
    started = Event.objects.filter(session=session, seq=turn_seq).values_list("created_at", flat=True).first()
    spent = Totals()
    usage_rows = Event.objects.filter(session=session, seq__gte=turn_seq, kind__in=USAGE_KINDS).values_list(
        "kind", "data"
    )
    for kind, data in usage_rows:
        spent = spent + entry_totals(kind, data)
    return LiveTurn(
        str(session.id),
        session.title or str(session.id),
        session.owner.get_username() if session.owner_id else "",
        session.profile.name if session.profile is not None else "",
        doing,
        started,
        spent,
    )


@dataclass(frozen=True)
class Row:
    session: Session
    status: str
    cost: str
    label: str = ""  # the status as people read it (actions/words.py)


def table(status: str, sort: str) -> tuple[list[Row], str, str]:
    """The session table: (rows, the filter and the sort applied); an unknown
    filter or sort falls back to all / recent."""
    status = status if status in FILTERS else "all"
    sort = sort if sort in SORTS else "recent"
    rows: QuerySet[Session] = (
        Session.objects.filter(FILTERS[status][1]).select_related("owner", "profile").order_by(*SORTS[sort][1])
    )
    return [Row(s, s.status, totals_of(s).cost_display) for s in rows[:TABLE_LIMIT]], status, sort


@dataclass(frozen=True)
class Line:
    """One event of a timeline: its one-line summary and its JSON."""

    seq: int
    kind: str
    at: str
    summary: str
    raw: str


def timeline(session_id: uuid.UUID, after: int = 0, limit: int = TIMELINE_PAGE) -> list[Line]:
    return [
        Line(e["seq"], e["kind"], e["at"], summarize(e["kind"], e["data"]), json.dumps(e["data"], indent=2))
        for e in events_page(session_id, after, limit)
    ]


def _short(text: Any) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= SUMMARY_CHARS else flat[: SUMMARY_CHARS - 1] + "…"


def summarize(kind: str, data: dict[str, Any]) -> str:
    """A readable line for an event: what an operator looks for first."""
    d = data or {}
    if kind in ("user/message", "input/queued", "input/held"):
        return _short(d.get("text") or d.get("reason") or "")
    if kind == "assistant/message":
        calls = [c.get("name", "?") for c in d.get("tool_calls") or []]
        text = _short(d.get("text") or d.get("content") or "")
        return (text + (" → calls " + ", ".join(calls) if calls else "")).strip()
    if kind.startswith("tool/"):
        name = d.get("name") or d.get("tool") or ""
        result = d.get("content") or d.get("result") or d.get("error") or d.get("outcome") or ""
        flag = " (error)" if d.get("is_error") else ""
        return _short(f"{name} {d.get('call_id', '')}{flag} {result}")
    if kind.startswith("approval/"):
        return _short(f"{d.get('name', '')} {d.get('verdict', '')} {d.get('by', '')} {d.get('reason', '')}")
    if kind in ("step/end", "usage/recorded"):
        usage = d.get("usage") or {}
        parts = [
            f"{d['purpose']}" if d.get("purpose") else "",
            f"step {d['step']}" if d.get("step") else "",
            str(d.get("model") or ""),
            f"{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens" if usage else "usage unknown",
            f"${usage['cost']}" if usage.get("cost") is not None else ("unpriced" if usage else ""),
            f"{d['latency_ms']} ms" if d.get("latency_ms") is not None else "",
        ]
        return _short(" · ".join(p for p in parts if p))
    if kind == "turn/end":
        return _short(f"{d.get('status', '')} {d.get('error', '')}")
    keys = ("reason", "by", "step", "status", "title", "spec", "role", "text")
    return _short(" · ".join(f"{k} {d[k]}" for k in keys if d.get(k) not in (None, "")))
