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

from django.template.loader import render_to_string
from django.urls import reverse

from approvals_app.selectors import pending as pending_calls
from approvals_app.selectors import queue_for
from sessions_app import permissions
from sessions_app.log.reads import blocked_info, waiting_info
from sessions_app.models import Event, Session
from sessions_app.permissions import can_resolve
from sessions_app.runtime.limits import Exceeded
from sessions_app.services import budgets as budget_services
from sessions_app.services import effects as effect_services
from sessions_app.services.usage import format_cost
from sessions_app.web.forms import BudgetForm

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
    }
)
STATUS_LABELS = {
    "idle": "idle",
    "running": "running",
    "waiting_approval": "waiting for approval",
    "waiting_reconcile": "waiting for an operator",
    "suspended": "suspended by an operator",
    "revoked": "revoked",
    "blocked": "blocked",
}
# What a batch of events must contain for the page's approvals to change.
APPROVAL_MOVES = frozenset({"approval/requested", "approval/resolved", "turn/start", "turn/end"})
# ... and for its notice of effects of unknown outcome.
EFFECT_MOVES = frozenset({"tool/unknown", "tool/resolved", "turn/start", "turn/end"})
# ... and for its budget figures (spend, limits, what is exhausted).
BUDGET_MOVES = frozenset({"budget/updated", "usage/recorded", "step/end", "turn/start", "turn/end", "input/held"})
# How much of a pending effect's arguments the notice shows.
EFFECT_ARGS_CHARS = 200


def status_label(status: str) -> str:
    return STATUS_LABELS.get(status, status)


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

    @property
    def slug(self) -> str:
        return self.kind.replace("/", "-")

    @property
    def meta(self) -> bool:
        # A queued input that has landed shows up again as the context it
        # became; its own row turns into bookkeeping.
        return self.kind in META_KINDS or (self.kind == "input/queued" and not self.queued)

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


def event_row(seq: int, kind: str, data: dict[str, Any], at: Any, inbox_seq: int) -> EventRow:
    return EventRow(seq, kind, data, at, queued=(kind == "input/queued" and seq > inbox_seq))


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

    def events(self, frames: list[tuple[int, str]]) -> list[Fragment]:
        """The fragments for a batch of committed events (socket frames), in
        order: each event appended to the log, queued inputs that landed shown
        as landed, and the header, the approvals and the bubble brought up to
        date. The socket fits each into a frame and packs them (sockets/page.py)."""
        session = Session.objects.filter(id=self.session_id).select_related("owner").first()
        if session is None:
            return []
        parsed = [json.loads(text) for _, text in frames]
        out: list[Fragment] = []
        landed: list[int] = []
        kinds = set()
        for f in parsed:
            kinds.add(f["kind"])
            data = f.get("data") or {}
            row = event_row(f["seq"], f["kind"], data, datetime.fromisoformat(f["at"]), session.inbox_seq)
            out.append(row_fragment(self.session_id, row))
            if f["kind"] == "turn/start":
                self.step = self.closed_step = 0  # steps count from 1 again
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
        for seq, kind, data, at in Event.objects.filter(session_id=self.session_id, seq__in=landed).values_list(
            "seq", "kind", "data", "created_at"
        ):
            out.append(
                row_fragment(self.session_id, event_row(seq, kind, data, at, session.inbox_seq), oob="outerHTML")
            )
        out.append(Fragment(render_to_string("sessions/chat.html#facts", facts_context(session, self.user, oob=True))))
        if "session/titled" in kinds:
            out.append(Fragment(render_to_string("sessions/chat.html#title", {"session": session, "oob": True})))
        if kinds & APPROVAL_MOVES:
            out.append(Fragment(approvals_fragment(session, self.user)))
        if kinds & EFFECT_MOVES:
            out.append(Fragment(effects_fragment(session, self.user)))
        if kinds & BUDGET_MOVES:
            out.append(Fragment(budget_figures_fragment(session)))
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
        "status_label": status_label(session.status),
        "blocked": blocked_info(session),
        "waiting": waiting_info(session),
        "cost_text": format_cost(session.cost, session.unpriced_entries),
        "can_drive": permissions.can_drive(user, session),
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
        "can_resolve": can_resolve(user, session),
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
        "can_drive": permissions.can_drive(user, session),
        "oob": oob,
    }


def budget_figures_fragment(session: Session) -> str:
    budget = budget_services.budget_of(session.id)
    context = {"budget": budget, "budget_rows": budget_rows(budget), "oob": True}
    return render_to_string("sessions/chat.html#budget_figures", context)


# ---------------------------------------------------------------- the dashboard's and the queue's sockets


def queue_fragment(user: Any) -> str:
    return render_to_string("approvals/queue.html#queue", {"queue": queue_for(user), "oob": True})
