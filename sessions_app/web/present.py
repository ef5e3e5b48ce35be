"""How the pages present the log: one place for an event's row, the status
labels, the notice of effects waiting for an operator, and the fragments
the pages' sockets send.

An event is rendered one way, by the `event` partial of
templates/sessions/chat.html, whether the page renders it or the page's
socket sends it later (sockets/page.py). The sockets send rendered
fragments as htmx out-of-band swaps, applied by htmx's ws extension; see
docs/web.md for why that is the one live mechanism of every page.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.template.defaultfilters import filesizeformat
from django.template.loader import render_to_string
from django.urls import reverse

from approvals_app.selectors import pending as pending_calls
from sessions_app.actions import allowed
from sessions_app.actions.files import workspace_files, writer_label
from sessions_app.actions.words import shown_state
from sessions_app.errors import NotAllowed, UnknownSession
from sessions_app.log.reads import blocked_info, waiting_info
from sessions_app.models import Event, Session
from sessions_app.runtime.limits import Exceeded
from sessions_app.services import budgets as budget_services
from sessions_app.services import effects as effect_services
from sessions_app.services.usage import USAGE_KINDS, Totals, entry_totals, format_cost
from sessions_app.web.forms import BudgetForm
from sessions_app.web.markdown import render_markdown

# Kinds that are bookkeeping rather than conversation: rendered (so every seq
# has exactly one element) but hidden unless "show all events" is ticked.
META_KINDS = frozenset(
    {
        "turn/start",
        "step/start",
        "step/end",
        "usage/recorded",
        "session/titled",
        "policy/updated",
        "model/updated",
        "agent/spawned",
        "agent/disposed",
        # The header says the session waits for an agent slot while it does.
        "agent/waiting",
        # An intent is bookkeeping; an unknown outcome and its resolution are not.
        "tool/attempt",
        # A monitor send's receipt: the monitors panel shows the edition it confirmed.
        "tool/receipt",
        # The input a schedule delivered shows as its own row, labelled Scheduled.
        "schedule/fired",
    }
)
# The events of one tool call after the message that made it: shown together
# on the call's card (its approval, its result), so their own rows are quiet.
CALL_KINDS = frozenset({"approval/requested", "approval/resolved", "tool/attempt", "tool/result"})
CARD_QUIET = frozenset({"approval/requested", "approval/resolved", "tool/result"})
# A task event's card says what the task became (runtime/owned/).
TASK_PHASES = {
    "task/started": "started",
    "task/waiting": "waited on",
    "task/progress": "running",
    "task/completed": "done",
    "task/failed": "failed",
    "task/cancelled": "cancelled",
    "task/blocked": "blocked",
    "task/wait_ended": "no longer waited on",
}
# Kinds whose text is shown as Markdown.
MARKDOWN_KINDS = frozenset({"user/message", "context/injected", "input/queued", "input/deferred", "assistant/message"})
# What a batch of events must contain for the page's approvals to change.
APPROVAL_MOVES = frozenset({"approval/requested", "approval/resolved", "turn/start", "turn/end"})
# ... and for its notice of effects of unknown outcome.
EFFECT_MOVES = frozenset({"tool/unknown", "tool/resolved", "turn/start", "turn/end"})
# ... and for its budget figures (spend, limits, what is exhausted).
BUDGET_MOVES = frozenset({"budget/updated", "usage/recorded", "step/end", "turn/start", "turn/end", "input/held"})
# ... and for its files panel (a document written or retired, by anyone: the agent's tools too).
DOCUMENT_MOVES = frozenset({"document/written", "document/retired"})
# The composer's notice ("Queued: ...", "Held: ...") emptied: sent once
# the input it speaks of is answered (it lands, or a turn takes it in).
NOTICE_CLEARED = '<p id="composer-notice" class="note composer-notice" role="status" hx-swap-oob="true"></p>'
# How much of a pending effect's arguments the notice shows.
EFFECT_ARGS_CHARS = 200


def pretty(raw: Any) -> str:
    """Tool arguments as indented JSON (they arrive as a JSON string)."""
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return raw
    return json.dumps(value, indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class EventRow:
    """One event as the `event` partial renders it."""

    seq: int
    kind: str
    data: dict[str, Any]
    at: Any
    queued: bool = False
    # Set on a row shown in part (its text cut to fit a socket frame): the
    # size of the whole row, and where to read the whole event.
    cut_bytes: int = 0
    full_url: str = ""
    # An assistant/message's tool calls, one card each; a turn/end's usage.
    cards: tuple[CallCard, ...] = ()
    turn_usage: Totals | None = None
    # A waiting input a budget holds: why (its input/held's words). The hold
    # is shown on the input's own row, so a held input is one row.
    held: str = ""
    # Who sent an input that no person typed: "schedule" or "monitor" (from
    # the input's `by`; a placed message's from the input it came from).
    origin: str = ""

    @property
    def sender(self) -> str:
        """The origin of an input as a label ("" for a person's)."""
        origin = self.origin or origin_of(self.data.get("by"))
        return ORIGIN_LABELS.get(origin, "")

    @property
    def sentence_who(self) -> str:
        return SENTENCE_KINDS.get(self.kind, "")

    @property
    def sentence(self) -> str:
        """A bookkeeping event (budget/*, schedule/*, an operator's hold, a file written) as a short sentence."""
        return bookkeeping_sentence(self.kind, self.data)

    @property
    def slug(self) -> str:
        return self.kind.replace("/", "-")

    @property
    def meta(self) -> bool:
        # A queued input that has landed shows up again as the context it
        # became; its own row turns into bookkeeping. A call's approval and
        # result are on its card.
        return (
            self.kind in META_KINDS
            or self.kind in CARD_QUIET
            or self.kind == "input/held"
            or (self.kind in ("input/queued", "input/deferred") and not self.queued)
        )

    @property
    def task_kind(self) -> str:
        """A task event's kind of task (command, subagent), "" for any other event."""
        if not self.kind.startswith("task/"):
            return ""
        return str(self.data.get("kind") or "owned")

    @property
    def task_phase(self) -> str:
        return TASK_PHASES.get(self.kind, "")

    @property
    def html(self) -> str:
        """The message's text as sanitized Markdown (web/markdown.py)."""
        if self.kind not in MARKDOWN_KINDS:
            return ""
        text = self.data.get("content") if self.kind == "assistant/message" else self.data.get("text")
        return render_markdown(str(text or ""))

    @property
    def turn_cost(self) -> str:
        """A turn/end's tokens and cost, "unpriced" when nothing was priced."""
        u = self.turn_usage
        if u is None:
            return ""
        steps = f"{u.steps} step{'s' if u.steps != 1 else ''}"
        return f"{steps} · {u.tokens:,} tokens · {u.cost_display}"

    @property
    def call_cards(self) -> tuple[CallCard, ...]:
        """The message's cards (with_cards fills them; bare ones otherwise)."""
        return self.cards or tuple(_message_cards(self))

    @property
    def tool_calls(self) -> list[dict[str, str]]:
        calls = self.data.get("tool_calls") or []
        return [{"id": c["id"], "name": c["name"], "args": pretty(c.get("arguments", ""))} for c in calls]

    @property
    def args_json(self) -> str:
        return pretty(self.data.get("args", {}))

    @property
    def reason_text(self) -> str:
        """A budget's reason (turn/end, input/held) in words; empty when there is none."""
        return budget_reason_text(self.data.get("reason"))

    @property
    def data_json(self) -> str:
        return json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))


ORIGIN_LABELS = {"schedule": "Scheduled", "monitor": "Monitor"}
# The kinds whose row is one short sentence (bookkeeping_sentence), and who it is by.
SENTENCE_KINDS = {
    "budget/updated": "Budget",
    "schedule/created": "Schedule",
    "schedule/cancelled": "Schedule",
    "schedule/paused": "Schedule",
    "session/suspended": "Operator",
    "session/resumed": "Operator",
    "session/revoked": "Operator",
    "session/restored": "Operator",
    "session/upgraded": "Agent version",
    # A file written (by the agent, a person's upload, a task) or removed: the files panel's rows.
    "document/written": "Files",
    "document/retired": "Files",
}


def origin_of(by: Any) -> str:
    """ "schedule" or "monitor" for an input sent by one ("schedule:<id>", "monitor:<id>"); else ""."""
    head = str(by or "").split(":", 1)[0]
    return head if head in ORIGIN_LABELS else ""


def _limit_words(data: dict[str, Any]) -> str:
    parts = []
    for name, label in (("cost_usd", "cost"), ("tokens", "tokens"), ("steps", "steps"), ("turns", "turns")):
        value = data.get(name)
        if value is not None:
            parts.append(f"{label} ${value:g}" if name == "cost_usd" else f"{label} {value}")
    return ", ".join(parts) or "no limits"


def _by(data: dict[str, Any]) -> str:
    by = str(data.get("by") or "")
    return f" by {by}" if by else ""


def _why(data: dict[str, Any]) -> str:
    reason = str(data.get("reason") or "")
    return f": {reason}" if reason else ""


def bookkeeping_sentence(kind: str, data: dict[str, Any]) -> str:
    """One short sentence for a bookkeeping event; "" for any other kind."""
    if kind == "budget/updated":
        return f"Budget set{_by(data)}: {_limit_words(data)}."
    if kind == "schedule/created":
        if data.get("cron"):
            when = f"on cron {data['cron']} (UTC)"
        elif data.get("every_seconds"):
            when = f"every {data['every_seconds']} s"
        else:
            when = f"once, at {str(data.get('due_at') or '')[:16].replace('T', ' ')} UTC"
        return f"Wake-up scheduled{_by(data)}, {when}{_why(data)}."
    if kind == "schedule/cancelled":
        return f"Schedule cancelled{_by(data)}{_why(data)}."
    if kind == "schedule/paused":
        return f"Schedule paused after {data.get('runs', 0)} runs{_why(data)}."
    if kind == "session/suspended":
        return f"Suspended{_by(data)}{_why(data)}: input is held until it is resumed."
    if kind == "session/resumed":
        return f"Resumed{_by(data)}{_why(data)}."
    if kind == "session/revoked":
        return f"Revoked{_by(data)}{_why(data)}: tools are denied and input is refused until it is restored."
    if kind == "session/restored":
        return f"Restored{_by(data)}{_why(data)}."
    if kind == "session/upgraded":
        return f"Moved to agent version {data.get('to')}{_by(data)}."
    if kind == "document/written":
        who, size = writer_label(str(data.get("by") or "")), filesizeformat(data.get("size") or 0)
        return f"{data.get('name')} written by {who}: version {data.get('version')}, {size}."
    if kind == "document/retired":
        ended = " (its task ended)" if data.get("reason") == "task_ended" else ""
        return f"{data.get('name')} removed{_by(data)}{ended}."
    return ""


def with_origins(session_id: uuid.UUID | str, rows: list[EventRow]) -> list[EventRow]:
    """A message placed from an input a schedule or a monitor sent carries that
    origin, so the page never labels it "You" (one read of those inputs)."""
    placed = {
        int(r.data["source_seq"]): r.seq
        for r in rows
        if r.kind in ("user/message", "context/injected") and r.data.get("source_seq")
    }
    if not placed:
        return rows
    origin: dict[int, str] = {}
    sources = Event.objects.filter(session_id=session_id, seq__in=sorted(placed)).values_list("seq", "data")
    for seq, data in sources:
        found = origin_of((data or {}).get("by"))
        if found:
            origin[placed[seq]] = found
    if not origin:
        return rows
    return [dataclasses.replace(r, origin=origin[r.seq]) if r.seq in origin else r for r in rows]


def budget_reason_text(reason: Any) -> str:
    """A budget reason ({budget, scope, limit, spent, unpriced?}) as words."""
    if not isinstance(reason, dict):
        return ""
    try:
        return Exceeded(
            reason["budget"], reason["scope"], reason["limit"], reason["spent"], int(reason.get("unpriced") or 0)
        ).message
    except (KeyError, TypeError, ValueError):
        return ""


def held_text(data: dict[str, Any]) -> str:
    """An input/held's reason in words."""
    return str(data.get("text") or "") or budget_reason_text(data.get("reason")) or "a budget is exhausted"


def with_holds(rows: list[EventRow]) -> list[EventRow]:
    """Each waiting input a budget holds carries the hold on its own row
    (the input/held row itself is quiet)."""
    holds = {int(r.data.get("source_seq") or 0): held_text(r.data) for r in rows if r.kind == "input/held"}
    if not holds:
        return rows
    return [dataclasses.replace(r, held=holds[r.seq]) if r.queued and r.seq in holds else r for r in rows]


def event_row(seq: int, kind: str, data: dict[str, Any], at: Any, inbox_seq: int, deferred_cursor: int = 0) -> EventRow:
    """A row; an input still waiting for its place is `queued` (a steer past
    the inbox cursor, a follow-up past the deferred cursor)."""
    waiting = (kind == "input/queued" and seq > inbox_seq) or (kind == "input/deferred" and seq > deferred_cursor)
    return EventRow(seq, kind, data, at, queued=waiting)


# ---------------------------------------------------------------- tool-call cards and per-turn cost


def _slug(text: str) -> str:
    """For element ids: ASCII letters, digits, - and _ kept, anything else spelled out."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else f"_x{ord(c):x}_" for c in text)


@dataclass
class CallCard:
    """One tool call with what became of it: asked, approved or denied (by
    whom, why), its result and how long it took."""

    id: str
    name: str
    args: str = ""
    proposed_at: datetime | None = None
    asked: bool = False
    verdict: str = ""
    by: str = ""
    reason: str = ""
    edited_args: str = ""
    started_at: datetime | None = None
    result: str | None = None
    is_error: bool = False
    ended_at: datetime | None = None

    @property
    def slug(self) -> str:
        return _slug(self.id)

    @property
    def state(self) -> str:
        if self.verdict == "deny":
            return "denied"
        if self.result is not None:
            return "error" if self.is_error else "done"
        if self.verdict == "approve":
            return "approved"
        if self.asked:
            return "asked"
        return "running"

    @property
    def state_label(self) -> str:
        return {
            "denied": "denied",
            "error": "failed",
            "done": "done",
            "approved": "approved, running",
            "asked": "waiting for approval",
            "running": "running",
        }[self.state]

    @property
    def duration(self) -> str:
        start = self.started_at or self.proposed_at
        if start is None or self.ended_at is None or self.state == "denied":
            return ""
        seconds = max(0.0, (self.ended_at - start).total_seconds())
        return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"

    def take(self, kind: str, data: dict[str, Any], at: datetime) -> None:
        """Fold one of the call's later events in."""
        if kind == "approval/requested":
            self.asked = True
            self.started_at = None
        elif kind == "approval/resolved":
            self.verdict, self.by, self.reason = (
                str(data.get("verdict", "")),
                data.get("by", ""),
                data.get("reason", ""),
            )
            if data.get("edited_args") is not None:
                self.edited_args = pretty(data["edited_args"])
            self.started_at = at  # the wait for a reviewer is not the tool's time
        elif kind == "tool/attempt":
            self.started_at = at
        elif kind == "tool/result":
            self.result, self.is_error, self.ended_at = str(data.get("content", "")), bool(data.get("is_error")), at


def _message_cards(row: EventRow) -> list[CallCard]:
    return [
        CallCard(
            id=c["id"], name=c["name"], args=c["args"], proposed_at=row.at if isinstance(row.at, datetime) else None
        )
        for c in row.tool_calls
    ]


def _turn_totals(rows: list[tuple[str, dict[str, Any]]]) -> Totals:
    total = Totals()
    for kind, data in rows:
        if kind == "usage/recorded" and data.get("purpose") != "step":
            continue  # a title or a compaction is not the turn's own spend
        total = total + entry_totals(kind, data)
    return total


def turn_usage_of(session_id: uuid.UUID | str, end_seq: int) -> Totals:
    """The usage of the turn that `end_seq` (its turn/end) closed, from the log."""
    start = (
        Event.objects.filter(session_id=session_id, kind="turn/start", seq__lt=end_seq)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    qs = Event.objects.filter(session_id=session_id, kind__in=USAGE_KINDS, seq__gt=start or 0, seq__lt=end_seq)
    return _turn_totals(list(qs.values_list("kind", "data")))


def with_cards(session_id: uuid.UUID | str, rows: list[EventRow]) -> list[EventRow]:
    """`rows` (in seq order) with each assistant/message's call cards filled
    from the call events among them, and each turn/end's usage (from the rows
    when its turn/start is among them, else from the log)."""
    cards: dict[str, CallCard] = {}
    owner: dict[int, list[CallCard]] = {}
    usage: list[tuple[str, dict[str, Any]]] | None = None
    turn: dict[int, Totals] = {}
    for row in rows:
        if row.kind == "assistant/message" and row.data.get("tool_calls"):
            owner[row.seq] = _message_cards(row)
            cards.update((c.id, c) for c in owner[row.seq])
        elif row.kind in CALL_KINDS and (card := cards.get(str(row.data.get("call_id", "")))) is not None:
            card.take(row.kind, row.data, row.at)
        if row.kind == "turn/start":
            usage = []
        elif row.kind in USAGE_KINDS and usage is not None:
            usage.append((row.kind, row.data))
        elif row.kind == "turn/end":
            turn[row.seq] = _turn_totals(usage) if usage is not None else turn_usage_of(session_id, row.seq)
            usage = None
    if not owner and not turn:
        return rows
    return [
        dataclasses.replace(row, cards=tuple(owner.get(row.seq, ())), turn_usage=turn.get(row.seq))
        if row.seq in owner or row.seq in turn
        else row
        for row in rows
    ]


def call_cards(session_id: uuid.UUID | str, call_ids: set[str], *, since_seq: int = 0) -> list[CallCard]:
    """Cards for calls whose message is not at hand (a live update of an
    earlier message's call): rebuilt from the call's own events."""
    found: dict[str, CallCard] = {}
    qs = Event.objects.filter(
        session_id=session_id, kind__in=CALL_KINDS, seq__gte=since_seq, data__call_id__in=sorted(call_ids)
    ).order_by("seq")
    for seq, kind, data, at in qs.values_list("seq", "kind", "data", "created_at"):
        cid = str(data.get("call_id", ""))
        card = found.get(cid)
        if card is None:
            card = found[cid] = CallCard(
                id=cid, name=str(data.get("name", "")), proposed_at=_message_at(session_id, seq)
            )
        card.take(kind, data, at)
    return list(found.values())


def _message_at(session_id: uuid.UUID | str, before_seq: int) -> datetime | None:
    """When the message that made a call committed: the latest assistant/message before its events."""
    return (
        Event.objects.filter(session_id=session_id, kind="assistant/message", seq__lt=before_seq)
        .order_by("-seq")
        .values_list("created_at", flat=True)
        .first()
    )


def card_swaps(card: CallCard) -> str:
    """A card's state and outcome as out-of-band swaps (its arguments do not change)."""
    return render_to_string("sessions/chat.html#card_state", {"call": card, "oob": True}) + render_to_string(
        "sessions/chat.html#card_outcome", {"call": card, "oob": True}
    )


def render_event(row: EventRow, *, oob: str = "") -> str:
    return render_to_string("sessions/chat.html#event", {"ev": row, "oob": oob})


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _cut(value: Any, chars: int) -> Any:
    """`value` with every string longer than `chars` cut (marked with an
    ellipsis) and every list kept to its first `chars // 8` items."""
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + "\u2026"
    if isinstance(value, list):
        return [_cut(v, chars) for v in value[: max(1, chars // 8)]]
    if isinstance(value, dict):
        return {k: _cut(v, chars) for k, v in value.items()}
    return value


# What the page's socket sends when a fragment that is not an event row is
# too large for a frame (a row is shown in part instead; see Fragment).
TOO_LARGE_NOTICE = (
    '<p id="live-notice" class="note" role="status" hx-swap-oob="true">'
    "Part of this page was too large to update live: reload the page to see it.</p>"
)


@dataclass(frozen=True)
class Fragment:
    """One out-of-band swap of a batch: an event's row (`row` set), or the
    header, the approvals, the title or the bubble."""

    html: str
    row: EventRow | None = None
    session_id: uuid.UUID | None = None
    oob: str = ""

    def stand_in(self, html: str, nbytes: int, *, max_bytes: int) -> str:
        """What the socket sends when `html` is over `max_bytes`: the row with
        its text cut, marked "shown in part" and linking to the whole event;
        the notice for anything else."""
        if self.row is None or self.session_id is None:
            return TOO_LARGE_NOTICE
        url = reverse("terret_api:list_events", args=[self.session_id])
        row = dataclasses.replace(self.row, cut_bytes=nbytes, full_url=f"{url}?after={self.row.seq - 1}&limit=1")
        chars = max(64, max_bytes // 8)
        while chars >= 64:  # escaping can grow the text: cut harder until it fits
            out = _row_swap(dataclasses.replace(row, data=_cut(row.data, chars)), self.oob)
            if _utf8_size(out) <= max_bytes:
                return out
            chars //= 4
        return _row_swap(dataclasses.replace(row, data={}), self.oob)


def _row_swap(row: EventRow, oob: str) -> str:
    """The row appended to the log, or with `oob` swapped in place of its old self."""
    html = render_event(row, oob=oob)
    return html if oob else f'<ol hx-swap-oob="beforeend:#log">{html}</ol>'


def row_fragment(session_id: uuid.UUID, row: EventRow, *, oob: str = "") -> Fragment:
    return Fragment(_row_swap(row, oob), row, session_id, oob)


# ---------------------------------------------------------------- the chat page's socket


@dataclass
class ChatFollower:
    """What one chat page's socket has shown, so each batch sends only what changed."""

    session_id: uuid.UUID
    user: Any
    stream_step: int | None = None  # the step whose deltas the bubble shows
    closed_step: int = 0  # the latest step whose assistant/message was sent: its late deltas are dropped
    step: int = 0
    turn_seq: int = 0  # the latest turn/start seen: a call's events are not older

    def events(self, frames: list[tuple[int, str]]) -> list[Fragment]:
        """The fragments for a batch of committed events (socket frames), in
        order: each event appended to the log, queued inputs that landed shown
        as landed, and the header, the approvals and the bubble brought up to
        date. The socket fits each into a frame and packs them (sockets/page.py)."""
        session = Session.objects.filter(id=self.session_id).select_related("owner").first()
        if session is None:
            return []
        parsed = [json.loads(text) for _, text in frames]
        rows = [
            event_row(
                f["seq"],
                f["kind"],
                f.get("data") or {},
                datetime.fromisoformat(f["at"]),
                session.inbox_seq,
                getattr(session, "deferred_cursor", 0),
            )
            for f in parsed
        ]
        rows = with_origins(self.session_id, with_cards(self.session_id, rows))
        out: list[Fragment] = []
        landed: list[int] = []
        holds: dict[int, str] = {}
        kinds = set()
        in_batch = {card.id for row in rows for card in row.cards}
        touched: set[str] = set()
        for f, row in zip(parsed, rows, strict=True):
            kinds.add(f["kind"])
            data = row.data
            out.append(row_fragment(self.session_id, row))
            if f["kind"] in CALL_KINDS and str(data.get("call_id", "")) not in in_batch:
                touched.add(str(data.get("call_id", "")))
            if f["kind"] == "turn/start":
                self.step = self.closed_step = 0  # steps count from 1 again
                self.turn_seq = int(f["seq"])
            elif f["kind"] == "step/start":
                self.step = int(data["step"])
            elif f["kind"] == "assistant/message":
                # Deltas arrive straight from the hub while this batch was read and
                # rendered: the bubble may already show the next step. Only the
                # bubble of this step or an earlier one is emptied.
                self.closed_step = self.step
                if self.stream_step is None or self.stream_step <= self.step:
                    out.append(Fragment(self.bubble(None, "")))
            elif f["kind"] == "turn/end":
                self.closed_step = max(self.step, self.stream_step or 0)
                out.append(Fragment(self.bubble(None, "")))
            elif f["kind"] in ("user/message", "context/injected") and data.get("source_seq"):
                landed.append(int(data["source_seq"]))
            elif f["kind"] == "input/held" and data.get("source_seq"):
                holds[int(data["source_seq"])] = held_text(data)
        redrawn = landed + [seq for seq in holds if seq not in landed]
        for seq, kind, data, at in Event.objects.filter(session_id=self.session_id, seq__in=redrawn).values_list(
            "seq", "kind", "data", "created_at"
        ):
            row = event_row(seq, kind, data, at, session.inbox_seq, getattr(session, "deferred_cursor", 0))
            if row.queued and seq in holds:
                row = dataclasses.replace(row, held=holds[seq])
            out.append(row_fragment(self.session_id, row, oob="outerHTML"))
        if touched:
            since = self.turn_seq or (session.open_turn_seq or 0)
            out.extend(Fragment(card_swaps(c)) for c in call_cards(self.session_id, touched, since_seq=since))
        out.append(Fragment(render_to_string("sessions/chat.html#facts", facts_context(session, self.user, oob=True))))
        if landed or "turn/start" in kinds:
            out.append(Fragment(NOTICE_CLEARED))
        if "session/titled" in kinds:
            out.append(Fragment(render_to_string("sessions/chat.html#title", {"session": session, "oob": True})))
        if kinds & APPROVAL_MOVES:
            out.append(Fragment(approvals_fragment(session, self.user)))
        if kinds & EFFECT_MOVES:
            out.append(Fragment(effects_fragment(session, self.user)))
        if kinds & BUDGET_MOVES:
            out.append(Fragment(budget_figures_fragment(session)))
        if kinds & DOCUMENT_MOVES and (files := files_fragment(session, self.user)):
            out.append(Fragment(files))
        return out

    def delta(self, step: int, text: str) -> str:
        """A streamed token delta for the bubble; empty for a step already closed."""
        if step <= self.closed_step:
            return ""
        if step != self.stream_step:
            return self.bubble(step, text)
        return render_to_string("sessions/chat.html#stream_more", {"text": text})

    def bubble(self, step: int | None, text: str) -> str:
        """The bubble's text replaced: emptied (hidden) after its step's
        message, or started over for a new step."""
        self.stream_step = step
        return render_to_string("sessions/chat.html#stream_text", {"stream_text": text, "oob": True})


def facts_context(session: Session, user: Any, *, oob: bool = False) -> dict[str, Any]:
    return {
        "session": session,
        "state": shown_state(session)[0],
        "status_label": shown_state(session)[1],
        "blocked": blocked_info(session),
        "waiting": waiting_info(session),
        "cost_text": format_cost(session.cost, session.unpriced_entries),
        "can_drive": allowed(user, session, "drive"),
        "oob": oob,
    }


def approvals_fragment(session: Session, user: Any) -> str:
    pending = pending_calls(session.id) if session.open_turn_seq is not None else []
    context = {
        "session": session,
        "pending": pending,
        "user": user,
        "approvals_next": reverse("sessions:chat", args=[session.id]),
        "oob": True,
    }
    return render_to_string("sessions/chat.html#approvals", context)


# ---------------------------------------------------------------- effects waiting for an operator


@dataclass(frozen=True)
class PendingEffect:
    """An attempt of unknown outcome, as the chat page's notice lists it."""

    call_id: str
    tool: str
    attempt: int
    replay: str
    arguments: str  # shortened to EFFECT_ARGS_CHARS
    attempted_at: datetime | None
    worker: str
    step: int | None
    turn_open: bool  # only an attempt of the open turn can be re-run

    @property
    def slug(self) -> str:
        """For element ids: the call id (ASCII letters, digits, - and _ kept,
        anything else spelled out) and the attempt."""
        safe = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else f"_x{ord(c):x}_" for c in self.call_id)
        return f"{safe}-{self.attempt}"


def shorten(arguments: str, chars: int = EFFECT_ARGS_CHARS) -> str:
    """A call's arguments on one line, cut to `chars` with an ellipsis."""
    flat = " ".join(arguments.split())
    return flat if len(flat) <= chars else flat[:chars] + "\u2026"


def pending_effects(session: Session) -> list[PendingEffect]:
    """The session's attempts of unknown outcome, oldest first; read only
    while its open turn waits on one (the ledger read scans the session's
    tool events, so it stays off the path of every other page view)."""
    if session.open_turn_seq is None or session.unknown_effects <= 0:
        return []
    return [
        PendingEffect(
            call_id=e.call_id,
            tool=e.tool,
            attempt=e.attempt,
            replay=e.replay,
            arguments=shorten(e.arguments),
            attempted_at=e.attempted_at,
            worker=e.worker,
            step=e.step,
            turn_open=e.turn_open,
        )
        for e in effect_services.effects(session.id)
        if e.state == "unknown"
    ]


def effects_context(
    session: Session, user: Any, *, oob: bool = False, notice: str = "", error: str = ""
) -> dict[str, Any]:
    return {
        "session": session,
        "unknown_effects": pending_effects(session),
        "can_resolve": allowed(user, session, "resolve"),
        "result_max": effect_services.MAX_RESULT_CHARS,
        "reason_max": effect_services.MAX_REASON_CHARS,
        "effects_notice": notice,
        "effects_error": error,
        "oob": oob,
    }


def effects_fragment(session: Session, user: Any) -> str:
    return render_to_string("sessions/chat.html#effects", effects_context(session, user, oob=True))


# ---------------------------------------------------------------- the session's budget

BUDGET_LABELS = {"cost_usd": "Cost", "tokens": "Tokens", "steps": "Steps", "turns": "Turns"}


def budget_rows(budget: dict[str, Any]) -> list[dict[str, str]]:
    """Spent against limit, one row per budget, as text ("unpriced" never shown as $0)."""
    spent, limit = budget["spent"], budget["limit"]
    rows = []
    for name, label in BUDGET_LABELS.items():
        if name == "cost_usd":
            spent_text = format_cost(spent[name], spent["unpriced"])
            limit_text = "no limit" if limit[name] is None else f"${limit[name]:g}"
        else:
            spent_text = str(spent[name])
            limit_text = "no limit" if limit[name] is None else str(limit[name])
        rows.append({"name": name, "label": label, "spent": spent_text, "limit": limit_text})
    return rows


def budget_context(
    session: Session, user: Any, *, oob: bool = False, notice: str = "", error: str = "", form: Any = None
) -> dict[str, Any]:
    """The chat page's budget panel: the figures, and the form for those who may drive."""
    budget = budget_services.budget_of(session.id)
    if form is None:
        form = BudgetForm(initial={k: v for k, v in budget["limit"].items() if v is not None})
    return {
        "session": session,
        "budget": budget,
        "budget_rows": budget_rows(budget),
        "budget_form": form,
        "budget_notice": notice,
        "budget_error": error,
        "can_drive": allowed(user, session, "drive"),
        "oob": oob,
    }


def files_fragment(session: Session, user: Any) -> str:
    """The files panel's count and list, swapped in place (the panel's open
    state and its upload form are left as they are); nothing for a user
    whose access ended meanwhile (the socket's own check closes it, 4403)."""
    try:
        files = workspace_files(user, session.id)
    except (NotAllowed, UnknownSession):
        return ""
    context = {"session": session, "files": files, "oob": True}
    return render_to_string("sessions/_files.html#files_count", context) + render_to_string(
        "sessions/_files.html#files_list", context
    )


def budget_figures_fragment(session: Session) -> str:
    budget = budget_services.budget_of(session.id)
    context = {"budget": budget, "budget_rows": budget_rows(budget), "oob": True}
    return render_to_string("sessions/chat.html#budget_figures", context)
