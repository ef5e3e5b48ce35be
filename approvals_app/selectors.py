"""Approval state, read from the open turn only.

An approval belongs to the turn that asked for it. A verdict applies to a
call only if it follows a request *in the open turn* naming the same call id,
tool and arguments: provider call ids are not unique across turns (nor across
the steps of one turn), and a verdict about other arguments is a verdict about
something else.

Pairing: an approval/resolved settles the latest unsettled request for its
call id that precedes it. A request asked again for the same call id while an
earlier one is still unsettled supersedes the earlier one (which then no
longer counts as pending); the loop never does that, but the log decides.

The approval clock's events name their request by seq: approval/expired with
on_expiry `deny` settles it as an expiry (never as a human's denial), with
`park` leaves it open; approval/reminded and approval/escalated only count.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import F, Sum

from sessions_app.log.reads import LoggedEvent
from sessions_app.models import Event, Session
from sessions_app.permissions import is_reviewer, visible_sessions

APPROVAL_KINDS = (
    "approval/requested",
    "approval/resolved",
    "approval/voided",
    "approval/reminded",
    "approval/escalated",
    "approval/expired",
)
# The events that name their request by seq (request_seq).
LATER_KINDS = APPROVAL_KINDS[2:]
# The reviewer's queue reads at most this many waiting sessions, oldest
# activity first, and shows at most QUEUE_ITEM_CAP calls.
QUEUE_SESSION_CAP = 200
QUEUE_ITEM_CAP = 500


@dataclass(frozen=True)
class PendingCall:
    call_id: str
    name: str
    args: dict[str, Any]
    seq: int

    def as_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "name": self.name, "args": self.args, "seq": self.seq}


@dataclass(frozen=True)
class Verdict:
    verdict: str  # approve | deny
    reason: str
    by: str = ""
    seq: int = 0
    # approve: the arguments the reviewer approved instead of the model's (None: as asked).
    edited_args: dict[str, Any] | None = None
    # A reviewer's: what their authority rested on (sessions_app/permissions.py grounds_of).
    grounds: dict[str, Any] | None = None
    # Not a human's: the request's deadline passed (approval/expired, on_expiry deny).
    expired: bool = False


@dataclass
class ApprovalRecord:
    """One approval/requested and what became of it."""

    seq: int
    call_id: str
    name: str
    args: dict[str, Any]
    verdict: Verdict | None = None
    superseded: bool = False
    # The clock the request runs on (approval/requested's `deadline`; None: no clock).
    deadline: dict[str, Any] | None = None
    # The n of its latest approval/reminded (how many intervals it had waited then).
    reminded: int = 0
    escalated: bool = False
    # approval/expired with on_expiry park: past its deadline, still open.
    expired: bool = False
    # approval/voided: why its approval no longer stood.
    voided: str | None = None

    @property
    def open(self) -> bool:
        return self.verdict is None and not self.superseded

    def binds(self, call_id: str, name: str, args: Any) -> bool:
        return self.call_id == call_id and self.name == name and canonical(self.args) == canonical(args)

    def as_pending(self) -> PendingCall:
        return PendingCall(self.call_id, self.name, self.args, self.seq)


def canonical(args: Any) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def approval_records(events: list[LoggedEvent]) -> list[ApprovalRecord]:
    """Every request in `events` (one turn) paired with its verdict, in seq order."""
    records: list[ApprovalRecord] = []
    unsettled: dict[str, ApprovalRecord] = {}
    by_seq: dict[int, ApprovalRecord] = {}
    for e in events:
        if e.kind == "approval/requested":
            earlier = unsettled.get(e.data["call_id"])
            if earlier is not None:
                earlier.superseded = True
            record = ApprovalRecord(
                e.seq, e.data["call_id"], e.data["name"], e.data["args"], deadline=e.data.get("deadline")
            )
            unsettled[record.call_id] = by_seq[e.seq] = record
            records.append(record)
        elif e.kind == "approval/resolved":
            settled = unsettled.pop(e.data["call_id"], None)
            if settled is not None:
                settled.verdict = Verdict(
                    e.data["verdict"],
                    e.data.get("reason", ""),
                    e.data.get("by", ""),
                    e.seq,
                    e.data.get("edited_args"),
                    e.data.get("grounds"),
                )
        elif e.kind in LATER_KINDS and e.data.get("request_seq") in by_seq:
            _later_event(by_seq[e.data["request_seq"]], e, unsettled)
    return records


def _later_event(record: ApprovalRecord, e: LoggedEvent, unsettled: dict[str, ApprovalRecord]) -> None:
    """Fold in an event that names the request by seq (approval/voided, and the clock's)."""
    if e.kind == "approval/voided":
        record.voided = e.data["reason"]
    elif e.kind == "approval/reminded":
        record.reminded = max(record.reminded, e.data["n"])
    elif e.kind == "approval/escalated":
        record.escalated = True
    elif record.open:  # approval/expired
        record.expired = True
        if e.data["on_expiry"] == "deny":
            unsettled.pop(record.call_id, None)
            reason = f"the request for approval expired: no verdict within {e.data['deadline_s']} s"
            record.verdict = Verdict("deny", reason, "", e.seq, expired=True)


def pending_from_events(events: list[LoggedEvent]) -> list[PendingCall]:
    return [r.as_pending() for r in approval_records(events) if r.open]


def open_turn_approvals(session_id: uuid.UUID | str, turn_seq: int) -> list[LoggedEvent]:
    """The approval events of the turn that opened at `turn_seq` (index range scan)."""
    rows = (
        Event.objects.filter(session_id=session_id, seq__gte=turn_seq, kind__in=APPROVAL_KINDS)
        .order_by("seq")
        .values_list("seq", "kind", "data")
    )
    return [LoggedEvent(s, k, d) for s, k, d in rows]


def pending(session_id: uuid.UUID | str) -> list[PendingCall]:
    """The open turn's calls still awaiting a verdict (none once the turn ends)."""
    turn_seq = Session.objects.filter(id=session_id).values_list("open_turn_seq", flat=True).first()
    if turn_seq is None:
        return []
    return pending_from_events(open_turn_approvals(session_id, turn_seq))


def request_in_turn(
    events: list[LoggedEvent], call_id: str, name: str, args: Any, *, after_seq: int = 0
) -> ApprovalRecord | None:
    """The latest request in this turn, after `after_seq` (the assistant
    message that made the call), bound to exactly this call id, tool and args."""
    found: ApprovalRecord | None = None
    for record in approval_records(events):
        if record.seq > after_seq and record.binds(call_id, name, args):
            found = record
    return found


def verdict_in_turn(
    events: list[LoggedEvent], call_id: str, name: str, args: Any, *, after_seq: int = 0
) -> Verdict | None:
    record = request_in_turn(events, call_id, name, args, after_seq=after_seq)
    return record.verdict if record is not None else None


# ---------------------------------------------------------------- the queue


@dataclass(frozen=True)
class QueueItem:
    session_id: uuid.UUID
    session_title: str
    call_id: str
    name: str
    args: dict[str, Any]
    seq: int
    requested_at: datetime
    # The text of the assistant message that made the call ("" when it had none).
    assistant_text: str = ""

    @property
    def args_pretty(self) -> str:
        return json.dumps(self.args, indent=2, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class Queue:
    items: list[QueueItem]
    truncated: bool  # more sessions or calls are waiting than were read

    def __len__(self) -> int:
        return len(self.items)


def pending_count(user: Any) -> int:
    """How many calls wait for `user`'s verdict across the sessions they may
    decide (the navigation bar's count): one aggregate over the
    pending_approvals projection, which the append transaction keeps."""
    if not is_reviewer(user):
        return 0
    waiting = visible_sessions(user, Session.objects.all()).filter(pending_approvals__gt=0, open_turn_seq__isnull=False)
    return int(waiting.aggregate(n=Sum("pending_approvals"))["n"] or 0)


def queue_for(user: Any, *, session_cap: int = QUEUE_SESSION_CAP, item_cap: int = QUEUE_ITEM_CAP) -> Queue:
    """Pending approvals across the sessions `user` may decide, oldest first.

    Bounded: candidate sessions come from the pending_approvals projection
    (kept by the append transaction), and their open turns' approval events
    are read in one query.
    """
    if not is_reviewer(user):
        return Queue([], False)
    waiting = visible_sessions(user, Session.objects.all()).filter(pending_approvals__gt=0, open_turn_seq__isnull=False)
    sessions = list(waiting.order_by("last_event_at").values("id", "title", "open_turn_seq")[: session_cap + 1])
    truncated = len(sessions) > session_cap
    sessions = sessions[:session_cap]
    by_id = {s["id"]: s for s in sessions}
    rows = (
        Event.objects.filter(session_id__in=list(by_id), kind__in=APPROVAL_KINDS, seq__gte=F("session__open_turn_seq"))
        .order_by("session_id", "seq")
        .values_list("session_id", "seq", "kind", "data", "created_at")
    )
    grouped: dict[uuid.UUID, list[LoggedEvent]] = {}
    stamps: dict[tuple[uuid.UUID, int], datetime] = {}
    for sid, seq, kind, data, at in rows:
        grouped.setdefault(sid, []).append(LoggedEvent(seq, kind, data))
        stamps[(sid, seq)] = at
    said = _assistant_texts(list(by_id))
    items = [
        QueueItem(
            sid, by_id[sid]["title"], p.call_id, p.name, p.args, p.seq, stamps[(sid, p.seq)], _said(said, sid, p.seq)
        )
        for sid, events in grouped.items()
        for p in pending_from_events(events)
    ]
    items.sort(key=lambda i: (i.requested_at, str(i.session_id), i.seq))
    if len(items) > item_cap:
        items, truncated = items[:item_cap], True
    return Queue(items, truncated)


def inline_for(session_id: uuid.UUID | str) -> list[QueueItem]:
    """The session's pending calls with their request times (for the session page)."""
    row = Session.objects.filter(id=session_id).values("id", "title", "open_turn_seq").first()
    if row is None or row["open_turn_seq"] is None:
        return []
    return with_times(
        row["id"], row["title"], pending_from_events(open_turn_approvals(row["id"], row["open_turn_seq"]))
    )


def with_times(session_id: uuid.UUID, title: str, calls: list[PendingCall]) -> list[QueueItem]:
    if not calls:
        return []
    stamps = dict(
        Event.objects.filter(session_id=session_id, seq__in=[c.seq for c in calls]).values_list("seq", "created_at")
    )
    said = _assistant_texts([session_id])
    return [
        QueueItem(session_id, title, c.call_id, c.name, c.args, c.seq, stamps[c.seq], _said(said, session_id, c.seq))
        for c in calls
        if c.seq in stamps
    ]


# What the reviewer reads of the message that made a call: enough to judge
# it, not a whole essay (the session page has the rest).
ASSISTANT_TEXT_CHARS = 1200


def _assistant_texts(session_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[tuple[int, str]]]:
    """The open turns' assistant messages of these sessions, (seq, text) in
    seq order: one query, bounded by the open turns (as the queue's own read)."""
    rows = (
        Event.objects.filter(session_id__in=session_ids, kind="assistant/message", seq__gte=F("session__open_turn_seq"))
        .order_by("session_id", "seq")
        .values_list("session_id", "seq", "data__content")
    )
    found: dict[uuid.UUID, list[tuple[int, str]]] = {}
    for sid, seq, content in rows:
        text = content if isinstance(content, str) else ""
        found.setdefault(sid, []).append((seq, text[:ASSISTANT_TEXT_CHARS]))
    return found


def _said(texts: dict[uuid.UUID, list[tuple[int, str]]], session_id: uuid.UUID, request_seq: int) -> str:
    """The text that led to the call: the message that made it, or, when that
    one carried only calls, the turn's last assistant text before it."""
    before = [text for seq, text in texts.get(session_id, []) if seq < request_seq and text.strip()]
    return before[-1] if before else ""


# ---------------------------------------------------------------- per-session waivers


def auto_approved(session_id: uuid.UUID | str, policy_seq: int | None, tool: str) -> bool:
    """Does the session's policy in force (the policy/updated at `policy_seq`)
    let `tool` run without asking? Set by "approve and allow for this session"
    (approvals_app.services.decide, policies_app.services.allow_without_approval)."""
    return tool in waived_tools(session_id, policy_seq)


def waiver_grant(session_id: uuid.UUID | str, policy_seq: int | None, tool: str) -> dict[str, Any] | None:
    """The grounds of the reviewer whose "allow for this session" waived
    `tool` in the policy at `policy_seq` (None: none recorded)."""
    if policy_seq is None:
        return None
    data = (
        Event.objects.filter(session_id=session_id, seq=policy_seq, kind="policy/updated")
        .values_list("data", flat=True)
        .first()
    )
    grants = (data or {}).get("grants")
    grant = grants.get(tool) if isinstance(grants, dict) else None
    return grant if isinstance(grant, dict) else None


def waived_tools(session_id: uuid.UUID | str, policy_seq: int | None) -> list[str]:
    """The tools the policy/updated at `policy_seq` lets run without asking."""
    if policy_seq is None:
        return []  # the profile's floor waives nothing
    data = (
        Event.objects.filter(session_id=session_id, seq=policy_seq, kind="policy/updated")
        .values_list("data", flat=True)
        .first()
    )
    names = (data or {}).get("auto_approve") or []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
