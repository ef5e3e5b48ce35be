"""Progress-aware liveness: is a running turn getting anywhere?

A running turn's progress is its last event (the session row's
last_event_at), the text its model stream gave (the lease holder's progress
mark, progress_at and streamed_tokens, which the lease keeper writes with
its renewal: runtime/lease.py; a streamed token costs no write of its own,
so the mark lags by up to a third of the lease), and its tool calls in
flight, with their age (the effect ledger's attempts in_flight). SSE
keep-alive comments are no progress: a provider can trickle them forever.

A running turn (status running, its lease live) with none of that for
TERRET_STALL_SECONDS is stalled. Every worker's sweep (runtime/sweep.py)
looks for such turns and appends `turn/stalled {since, phase}` once, deciding
under the session's row lock, so two workers' sweeps cannot both report it.
It is appended without a fence: the process that reports a stall is not the
one holding the lease, and the report changes nothing the holder decides
by. A profile whose `on_stall` is "cancel" also cancels the turn in the same
lock (turn/cancel_requested): the holder's stop watch ends its model call
(runtime/stop.py); a tool call ends the turn when it returns.

The stall stands while nothing happens after it (log/reads.py stall_stands):
an event after it, or streamed text after it, ends it (stalled_since goes
back to None), and a stall of the same turn after that is reported again.
A turn whose worker is gone is not stalled but unowned: the sweep drives it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from sessions_app import log
from sessions_app.log.reads import stall_stands
from sessions_app.log.records import LoggedEvent
from sessions_app.log.upcasters import lift
from sessions_app.models import Event, Session
from sessions_app.runtime import effects

SWEEP_BATCH = 100
# The kinds that say where the open step stands.
STEP_KINDS = (
    "step/start",
    "step/end",
    "assistant/message",
    "tool/attempt",
    "tool/result",
    "tool/unknown",
    "tool/resolved",
)
CANCELLED_BY = "stall watch"

# A running turn: the terms of Session.status's "running".
RUNNING = Q(
    open_turn_seq__isnull=False,
    pending_approvals=0,
    unknown_effects=0,
    blocked_seq__isnull=True,
    waiting_seq__isnull=True,
    suspended_seq__isnull=True,
    revoked_seq__isnull=True,
)
# log/reads.py stall_stands, in SQL: the turn's turn/stalled is its newest
# event and no streamed text came after it.
STALL_STANDS = Q(open_turn_seq__isnull=False, stalled_seq__isnull=False, stalled_seq=F("last_seq")) & (
    Q(progress_at__isnull=True) | Q(progress_at__lte=F("last_event_at"))
)


@dataclass(frozen=True)
class ToolInFlight:
    name: str
    since: datetime | None


@dataclass(frozen=True)
class Progress:
    """What the open turn has done lately (phase None: no turn is open).
    streamed_tokens counts the text chunks of the current model call, as of
    the holder's last lease renewal; 0 outside the model phase."""

    last_event_at: datetime | None
    phase: str | None
    streamed_tokens: int
    tools_in_flight: list[ToolInFlight]

    def as_json(self) -> dict[str, Any]:
        return {
            "last_event_at": _iso(self.last_event_at),
            "phase": self.phase,
            "streamed_tokens": self.streamed_tokens,
            "tools_in_flight": [{"name": t.name, "since": _iso(t.since)} for t in self.tools_in_flight],
        }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def turn_progress(session: Session) -> Progress:
    """The open turn's progress: two bounded reads (its latest step's start,
    then that step's events), none when no turn is open."""
    if session.open_turn_seq is None:
        return Progress(session.last_event_at, None, 0, [])
    phase, tools = _phase(session.id, session.open_turn_seq)
    streamed = session.streamed_tokens if phase == "model" else 0
    return Progress(session.last_event_at, phase, streamed, [ToolInFlight(a.name, a.at) for a in tools])


def _phase(session_id: uuid.UUID, turn_seq: int) -> tuple[str, list[effects.Attempt]]:
    """model (a step waits for its reply), tool (a call is in flight) or turn
    (between steps: intake, the gate, closing), and the calls in flight."""
    turn = Event.objects.filter(session_id=session_id, seq__gte=turn_seq)
    start = turn.filter(kind="step/start").order_by("-seq").values_list("seq", flat=True).first()
    if start is None:
        return "turn", []
    rows = (
        turn.filter(seq__gte=start, kind__in=STEP_KINDS)
        .order_by("seq")
        .values_list("seq", "kind", "data", "created_at", "version")
    )
    # A monitor's send (its ledger entries name an edition) is no step's: it may land mid-turn.
    events = [
        (LoggedEvent(seq, kind, lift(kind, version, data)), at)
        for seq, kind, data, at, version in rows
        if "edition_id" not in data
    ]
    running = effects.in_flight(events)
    if running:
        return "tool", running
    kinds = {e.kind for e, _ in events}
    return ("model" if kinds == {"step/start"} else "turn"), []


def stalled_turns(now: datetime | None = None) -> list[Session]:
    """Running turns, their lease live, with no progress for
    TERRET_STALL_SECONDS and no stall of theirs standing: the sweep's candidates."""
    now = now or timezone.now()
    quiet_since = now - timedelta(seconds=settings.TERRET_STALL_SECONDS)
    found = (
        Session.objects.filter(RUNNING, lease_expires_at__gt=now, last_event_at__lt=quiet_since)
        .exclude(lease_owner="")
        .filter(Q(progress_at__isnull=True) | Q(progress_at__lt=quiet_since))
        .exclude(STALL_STANDS)
        .select_related("profile")
    )
    return list(found[:SWEEP_BATCH])


def report_stalls() -> list[str]:
    """One sweep round's part: report each stalled turn once, and cancel it
    where its profile says so. Returns the cancelled ones, for the sweep to
    wake (as services' cancel does); a report alone wakes nobody."""
    return [str(session.id) for session in stalled_turns() if report(session) == "cancelled"]


def report(session: Session) -> str | None:
    """Append turn/stalled for `session` if, under its row lock, it is still
    the same quiet running turn: "reported", or "cancelled" when its
    profile's on_stall cancelled it too; None if it made progress meanwhile."""
    phase, _ = _phase(session.id, session.open_turn_seq or 0)
    since = max(at for at in (session.last_event_at, session.progress_at) if at is not None)
    cancel = session.profile is not None and session.profile.on_stall == "cancel"
    with log.locked(session.id) as tx:
        if tx.row["last_seq"] != session.last_seq or tx.row["open_turn_seq"] != session.open_turn_seq:
            return None  # something happened since it was read: that is progress
        fresh = Session.objects.filter(id=session.id).values_list("progress_at", "cancel_seq").first()
        if fresh is None or fresh[0] != session.progress_at:
            return None  # its holder's keeper wrote streamed text since
        tx.append("turn/stalled", {"since": since.isoformat(), "phase": phase})
        if not (cancel and fresh[1] is None):
            return "reported"
        tx.append("turn/cancel_requested", {"by": CANCELLED_BY, "reason": "no progress (on_stall: cancel)"})
    return "cancelled"


__all__ = ["STALL_STANDS", "Progress", "ToolInFlight", "report_stalls", "stall_stands", "turn_progress"]
