"""Compaction: replace the model's view of old history with a summary.

A compaction appends session/compacted {upto_seq, summary[, turn_seq]};
derive_messages then shows the summary in place of every event at or before
upto_seq.

Between turns (attempt() / compact()):

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
   The usage of every summarizer request is appended as usage/recorded (one
   event per request; a request whose provider reported no usage adds none)
   in the same transaction whether or not the compaction itself goes ahead:
   the spend happened, and session cost must stay complete.

Inside a turn (compact_in_turn(session_id, fence, turn_seq), called by the
runner through hooks.compact_in_turn at a step boundary, while its lease is
held): the same steps, except that the row must show that very turn open
(open_turn_seq == turn_seq) with no approval pending and no tool outcome
unknown, both before summarizing and again under the lock, which is taken
with the caller's fence (LeaseLost propagates: another worker owns the
session). The compacted event carries turn_seq. It returns None when it
compacted and the reason otherwise; it never raises for the summarizer's sake
(only LeaseLost and database errors propagate). At a step boundary every
tool call of the turn so far has its result, so the boundary is as safe as
between turns; nothing is parked (pending_approvals == 0) and no call awaits
an operator (unknown_effects == 0).

The summary appended starts with a verbatim preamble, so the task survives
any number of compactions:

    Task (the session's first user message, verbatim):
    <the text of the session's first user/message event>

    Current request (verbatim):          (inside a turn only)
    <the text of the open turn's user/message>

then the summarizer's summary. Each text is cut to PREAMBLE_MAX_CHARS (8,000)
with a marker. The first user message is found by the (session, kind, seq)
index, never inside an earlier summary; inside the session's first turn the
current request is the task, and is given twice. A later compaction strips
the previous summary's Task block before the summarizer sees it (and its
Current request block, when it compacts inside the same turn), since it is
prepended again: the preamble appears once however many compactions follow.
A Current request block of an earlier turn stays in the summarizer's input,
as part of the earlier summary.

Spend on failure: a summarizer that fails after some of its requests
succeeded (SummarizerGaveUp carries their usages) has them appended as
usage/recorded, unfenced (usage is metadata), before the failure is reported;
likewise when the commit's fenced lock finds the lease lost.

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

from django.db import Error as DatabaseError

from sessions_app import log
from sessions_app.errors import DefinitionMissing, LeaseLost, SummarizerFailed, SummarizerNotConfigured
from sessions_app.llm.types import ModelError
from sessions_app.log.catalogue import MODEL_VISIBLE
from sessions_app.models import Agent, AgentProfile, Event, Session
from sessions_app.services.summarizers import (
    History,
    HistoryEvent,
    RequestUsage,
    Summary,
    get_summarizer,
    release_connection,
    spent,
)

logger = logging.getLogger(__name__)

# How far back the trigger looks for a step/end that carries a usage figure.
TRIGGER_LOOKBACK = 25
# The longest task / current request the preamble carries verbatim.
PREAMBLE_MAX_CHARS = 8_000
TASK_HEADING = "Task (the session's first user message, verbatim):\n"
REQUEST_HEADING = "Current request (verbatim):\n"

TURN_OPEN = "a turn is open; compaction happens between turns"
RACED = "model-visible events arrived while summarizing"
NOTHING_NEW = "nothing new to compact"


@dataclass(frozen=True)
class CompactionResult:
    seq: int
    upto_seq: int
    summary: str
    model: str


@dataclass(frozen=True)
class Declined:
    reason: str


# ---------------------------------------------------------------- the preamble


@dataclass(frozen=True)
class Preamble:
    """What the summary appended starts with (module docstring)."""

    task: str = ""  # the Task block, or ""
    request: str = ""  # the Current request block, or ""
    turn_seq: int | None = None  # the turn compacted inside, if any

    @property
    def text(self) -> str:
        return self.task + self.request

    def strip(self, summary: str, turn_seq: int | None) -> str:
        """An earlier summary (compacted inside `turn_seq`, if any) without
        the blocks this preamble prepends again."""
        if self.task and summary.startswith(self.task):
            summary = summary[len(self.task) :]
        if self.request and turn_seq is not None and turn_seq == self.turn_seq and summary.startswith(self.request):
            summary = summary[len(self.request) :]
        return summary


def _verbatim(text: str) -> str:
    if len(text) <= PREAMBLE_MAX_CHARS:
        return text
    marker = f"\n[… {len(text) - PREAMBLE_MAX_CHARS} more characters cut]"
    return text[:PREAMBLE_MAX_CHARS] + marker


def _first_user_message(sid: uuid.UUID, after: int = 0) -> tuple[int, str] | None:
    row = (
        Event.objects.filter(session_id=sid, kind="user/message", seq__gt=after)
        .order_by("seq")
        .values_list("seq", "data")
        .first()
    )
    return (row[0], str(row[1].get("text") or "")) if row is not None else None


def preamble_for(sid: uuid.UUID, turn_seq: int | None = None) -> Preamble:
    """The preamble of a compaction now (inside the turn begun at turn_seq, if given)."""
    task = _first_user_message(sid)
    if task is None:
        return Preamble(turn_seq=turn_seq)
    block = TASK_HEADING + _verbatim(task[1]) + "\n\n"
    # The open turn's user/message: the first after its turn/start (user
    # messages only open turns, and this one has not ended).
    request = _first_user_message(sid, turn_seq) if turn_seq is not None else None
    if request is None:
        return Preamble(block, "", turn_seq)
    return Preamble(block, REQUEST_HEADING + _verbatim(request[1]) + "\n\n", turn_seq)


# ---------------------------------------------------------------- between turns


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
        return Declined(TURN_OPEN)
    pre = preamble_for(sid)
    history = snapshot(sid, session.last_seq, pre)
    if not any(e.kind != "session/compacted" for e in history.events):
        return Declined(NOTHING_NEW)
    summarizer = get_summarizer(profile_of(session), sid)
    release_connection()  # the summarizer may take seconds; hold no pooled connection
    try:
        summary = summarizer.summarize(history)
    except SummarizerFailed as exc:
        record_usages(sid, spent(exc))
        raise
    if summary is None:
        return Declined(f"the {summarizer.name} summarizer declined")
    return _commit(sid, history, summary, pre)


# ---------------------------------------------------------------- inside a turn


def compact_in_turn(session_id: uuid.UUID, fence: log.Fence, turn_seq: int) -> str | None:
    """Compact inside the open turn begun at `turn_seq`, at a step boundary,
    under the caller's lease (`fence`). None when it compacted, else why not.
    Raises LeaseLost (from the commit), database errors, and DefinitionMissing
    when the summarizer, or the compactor role it needs, is gone (the runner
    blocks the turn on it when it needed the compaction)."""
    sid = uuid.UUID(str(session_id))
    session = Session.objects.select_related("profile").filter(id=sid).first()
    if session is None:
        return f"no session {sid}"
    refusal = turn_refusal(session.open_turn_seq, session.pending_approvals, session.unknown_effects, turn_seq)
    if refusal is not None:
        return refusal
    pre = preamble_for(sid, turn_seq)
    history = snapshot(sid, session.last_seq, pre)
    if not any(e.kind != "session/compacted" for e in history.events):
        return NOTHING_NEW
    try:
        summarizer = get_summarizer(profile_of(session), sid)
        release_connection()
        summary = summarizer.summarize(history)
    except (DatabaseError, LeaseLost, DefinitionMissing):
        raise
    except SummarizerNotConfigured as exc:
        raise DefinitionMissing("role:compactor", f"the summarizer needs the compactor role: {exc}") from exc
    except (SummarizerFailed, ModelError) as exc:
        record_usages(sid, spent(exc))
        logger.warning("compaction of %s inside its turn failed: %s", sid, exc)
        return f"the summarizer failed: {exc}"
    except Exception as exc:  # a summarizer's bug must not take the turn's runner down with it
        logger.exception("compaction of %s inside its turn failed", sid)
        return f"the summarizer failed: {type(exc).__name__}: {exc}"
    if summary is None:
        return f"the {summarizer.name} summarizer declined"
    outcome = _commit(sid, history, summary, pre, fence=fence, turn_seq=turn_seq)
    if isinstance(outcome, Declined):
        logger.info("compaction of %s inside its turn declined: %s", sid, outcome.reason)
        return outcome.reason
    return None


def turn_refusal(open_turn_seq: int | None, pending_approvals: int, unknown_effects: int, turn_seq: int) -> str | None:
    """Why the session cannot be compacted inside the turn begun at turn_seq now, or None."""
    if open_turn_seq != turn_seq:
        return f"the turn begun at {turn_seq} is not the session's open turn"
    if pending_approvals:
        return "approvals are pending in the open turn"
    if unknown_effects:
        return "a tool call of the open turn has an unknown outcome"
    return None


# ---------------------------------------------------------------- the commit


def _commit(
    sid: uuid.UUID,
    history: History,
    summary: Summary,
    pre: Preamble,
    *,
    fence: log.Fence | None = None,
    turn_seq: int | None = None,
) -> CompactionResult | Declined:
    try:
        with log.locked(sid, fence=fence) as tx:
            if turn_seq is None:
                reason = boundary_problem(tx.row, sid, history.head)
            else:
                row = tx.row
                reason = turn_refusal(
                    row["open_turn_seq"], row["pending_approvals"], row["unknown_effects"], turn_seq
                ) or _raced(sid, history.head)
            if reason is None and not summary.text:
                reason = "the summarizer returned an empty summary"
            result: CompactionResult | Declined
            if reason is not None:
                result = Declined(reason)
            else:
                upto = int(tx.row["last_seq"])
                text = pre.text + summary.text
                data: dict[str, Any] = {"upto_seq": upto, "summary": text}
                if turn_seq is not None:
                    data["turn_seq"] = turn_seq
                event = tx.append("session/compacted", data)
                result = CompactionResult(event.seq, upto, text, summary.model)
            for kind, payload in _usage_events(summary.usages):
                tx.append(kind, payload)
            if summary.learned_window:
                learned = {"role": "compactor", "spec": summary.model, "tokens": summary.learned_window}
                tx.append("model/window", {**learned, "source": summary.learned_source})
    except LeaseLost:
        record_usages(sid, summary.usages)  # the spend happened, whoever owns the session now
        raise
    return result


def _usage_events(usages: list[RequestUsage]) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("usage/recorded", {"purpose": "compaction", "model": u.model, "usage": u.usage.as_json()})
        for u in usages
        if u.usage is not None
    ]


def record_usages(sid: uuid.UUID, usages: list[RequestUsage]) -> None:
    """Append the usage of summarizer requests on their own (no compaction:
    the summarizer failed or the lease was lost), unfenced: usage is metadata."""
    events = _usage_events(usages)
    if events:
        log.append_many(sid, events)


def boundary_problem(row: dict[str, Any], sid: uuid.UUID, head: int) -> str | None:
    """Why compacting everything up to the log head between turns is unsafe
    now, or None. Call under the session row lock (row = log.locked's row)."""
    if row["open_turn_seq"] is not None or row["pending_approvals"]:
        return TURN_OPEN
    return _raced(sid, head)


def _raced(sid: uuid.UUID, head: int) -> str | None:
    if Event.objects.filter(session_id=sid, seq__gt=head, kind__in=MODEL_VISIBLE).exists():
        return RACED
    return None


def snapshot(sid: uuid.UUID, head: int, pre: Preamble | None = None) -> History:
    """The model-visible history up to `head`, from the latest compaction at or
    before it (its summary without the blocks `pre` prepends again). Bounded
    by the (session, kind, seq) index, never a log scan."""
    latest = (
        Event.objects.filter(session_id=sid, kind="session/compacted", seq__lte=head)
        .order_by("-seq")
        .values_list("seq", "data")
        .first()
    )
    events: list[HistoryEvent] = []
    after = 0
    if latest is not None:
        after, data = latest
        if pre is not None:
            data = {**data, "summary": pre.strip(data["summary"], data.get("turn_seq"))}
        events.append(HistoryEvent(after, "session/compacted", data))
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
