"""Compaction: replace the model's view of old history with a summary.

A compaction appends session/compacted {upto_seq, summary}; derive_messages
then shows the summary in place of every event at or before upto_seq.

How a compaction runs (compact()):

1. Read the session row. A turn is open -> decline (compaction happens between
   turns only). Take a snapshot of the model-visible history up to the row's
   last_seq (`head`), starting at the latest compaction.
2. Call the summarizer with no transaction and no pooled connection held.
3. Under the session row lock (log.locked) decide, then append:
   - a turn is open now (open_turn_seq is not None) -> decline;
   - any model-visible event has seq > head (it arrived while summarizing and
     the summary does not cover it) -> decline;
   - otherwise append session/compacted with upto_seq = the seq just before
     it (the row's last_seq under the lock).
   The summarizer's usage is appended as usage/recorded in the same
   transaction whether or not the compaction itself goes ahead: the spend
   happened, and session cost must stay complete.

Why the boundary is safe (never splits a tool call from its result, never
hides a call awaiting approval): the check and the append happen under the
row lock that every turn/start, tool/result and approval/* append also takes.
With no open turn under that lock, every turn in the log has ended; turns end
only after each of their tool calls got a tool/result (the loop pays owed
calls, even on cancel, before turn/end), and approvals belong to the open turn
(turn/end resets pending_approvals). So everything at or before upto_seq is
complete, nothing after it can answer a call before it, and no approval is
pending. Non-model-visible events (titles, usage, queued input) that landed
after the snapshot are harmless to cover: the model never sees them, and
queued input reaches the model later as a new context/injected event.

Failures: a summarizer that declines (Morph: no key, HTTP error, torn response)
or fails is non-fatal. The automatic trigger (maybe_compact) logs and moves
on, and the next overweight turn retries; a manual caller (button, admin
action, management command) gets SummarizerNotConfigured / SummarizerFailed
raised so it can say why.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection

from sessions_app import log
from sessions_app.log.catalogue import MODEL_VISIBLE
from sessions_app.models import Agent, AgentProfile, Event, Session
from sessions_app.services.summarizers import History, HistoryEvent, Summary, get_summarizer

logger = logging.getLogger(__name__)

# How far back the trigger looks for a step/end that carries a usage figure.
TRIGGER_LOOKBACK = 25


@dataclass(frozen=True)
class CompactionResult:
    seq: int
    upto_seq: int
    summary: str
    model: str


@dataclass(frozen=True)
class Declined:
    reason: str


def compact(session_id: uuid.UUID | str, *, manual: bool) -> CompactionResult | None:
    """Compact the session's history now. None: declined (the reason is
    logged; use attempt() to get it). manual=True raises summarizer
    configuration/model errors; manual=False (the trigger) logs them."""
    outcome = attempt(session_id, manual=manual)
    return outcome if isinstance(outcome, CompactionResult) else None


def attempt(session_id: uuid.UUID | str, *, manual: bool) -> CompactionResult | Declined:
    """compact(), returning the reason when it declines. Raises SessionNotFound."""
    sid = uuid.UUID(str(session_id))
    try:
        outcome = _attempt(sid)
    except Exception:
        if manual:
            raise
        logger.warning("automatic compaction of %s failed; the next overweight turn retries", sid, exc_info=True)
        return Declined("the summarizer failed")
    if isinstance(outcome, Declined):
        logger.info("compaction of %s declined: %s", sid, outcome.reason)
    return outcome


def _attempt(sid: uuid.UUID) -> CompactionResult | Declined:
    session = Session.objects.select_related("profile").filter(id=sid).first()
    if session is None:
        raise log.SessionNotFound(f"no session {sid}")
    if session.open_turn_seq is not None:
        return Declined("a turn is open; compaction happens between turns")
    history = snapshot(sid, session.last_seq)
    if not any(e.kind != "session/compacted" for e in history.events):
        return Declined("nothing new to compact")
    summarizer = get_summarizer(profile_of(session), sid)
    _release_connection()  # the summarizer may take seconds; hold no pooled connection
    summary = summarizer.summarize(history)
    if summary is None:
        return Declined(f"the {summarizer.name} summarizer declined")
    return _commit(sid, history, summary)


def _commit(sid: uuid.UUID, history: History, summary: Summary) -> CompactionResult | Declined:
    with log.locked(sid) as tx:
        reason = boundary_problem(tx.row, sid, history.head)
        if reason is None and not summary.text:
            reason = "the summarizer returned an empty summary"
        result: CompactionResult | Declined
        if reason is not None:
            result = Declined(reason)
        else:
            upto = int(tx.row["last_seq"])
            event = tx.append("session/compacted", {"upto_seq": upto, "summary": summary.text})
            result = CompactionResult(event.seq, upto, summary.text, summary.model)
        if summary.usage is not None:
            tx.append(
                "usage/recorded",
                {"purpose": "compaction", "model": summary.model, "usage": summary.usage.as_json()},
            )
    return result


def boundary_problem(row: dict[str, Any], sid: uuid.UUID, head: int) -> str | None:
    """Why compacting everything up to the log head is unsafe now, or None.
    Call under the session row lock (row = log.locked's row)."""
    if row["open_turn_seq"] is not None or row["pending_approvals"]:
        return "a turn is open; compaction happens between turns"
    if Event.objects.filter(session_id=sid, seq__gt=head, kind__in=MODEL_VISIBLE).exists():
        return "model-visible events arrived while summarizing"
    return None


def snapshot(sid: uuid.UUID, head: int) -> History:
    """The model-visible history up to `head`, from the latest compaction at or
    before it. Bounded by the (session, kind, seq) index, never a log scan."""
    latest = (
        Event.objects.filter(session_id=sid, kind="session/compacted", seq__lte=head)
        .order_by("-seq")
        .values_list("seq", "data")
        .first()
    )
    events: list[HistoryEvent] = []
    after = 0
    if latest is not None:
        after = latest[0]
        events.append(HistoryEvent(latest[0], "session/compacted", latest[1]))
    rows = (
        Event.objects.filter(session_id=sid, seq__gt=after, seq__lte=head, kind__in=MODEL_VISIBLE)
        .exclude(kind="session/compacted")
        .order_by("seq")
        .values_list("seq", "kind", "data")
    )
    events.extend(HistoryEvent(seq, kind, data) for seq, kind, data in rows)
    return History(sid, head, events)


def profile_of(session: Session) -> AgentProfile | None:
    if session.profile is not None:
        return session.profile
    agent = Agent.objects.select_related("profile").filter(session_id=session.id).first()
    return agent.profile if agent is not None else None


def _release_connection() -> None:
    # Inside a caller's transaction (a test, an admin action wrapped in
    # atomic) the connection cannot be closed; elsewhere hand it back.
    if not connection.in_atomic_block:
        connection.close()


# ---------------------------------------------------------------- trigger


def over_budget(session_id: uuid.UUID | str) -> bool:
    """The trigger: the last step/end's prompt_tokens reached the profile's
    compaction budget, and no compaction has happened since that step."""
    row = (
        Session.objects.filter(id=session_id)
        .values("open_turn_seq", "compacted_seq", "profile__compaction_budget")
        .first()
    )
    if row is None or row["open_turn_seq"] is not None:
        return False
    budget = row["profile__compaction_budget"]
    if not budget:
        return False
    since = row["compacted_seq"] or 0
    ends = (
        Event.objects.filter(session_id=session_id, kind="step/end", seq__gt=since)
        .order_by("-seq")
        .values_list("data", flat=True)[:TRIGGER_LOOKBACK]
    )
    for data in ends:
        figure = data.get("usage")
        if figure is not None:
            return int(figure.get("prompt_tokens", 0)) >= budget
    return False


def maybe_compact(session_id: uuid.UUID | str) -> CompactionResult | None:
    """Run by the post-turn task: compact if the turn that just ended was over
    budget. Never raises for a summarizer's sake."""
    if not over_budget(session_id):
        return None
    return compact(session_id, manual=False)
