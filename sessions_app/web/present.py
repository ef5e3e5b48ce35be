"""How the pages present the log: one place for an event's row, the status
labels, and the fragments the pages' sockets send.

An event is rendered one way, by the `event` partial of
templates/sessions/chat.html, whether the page renders it or the page's
socket sends it later (sockets/page.py). The sockets send rendered
fragments as htmx out-of-band swaps, applied by htmx's ws extension; see
docs/web.md for why that is the one live mechanism of every page.
"""

from __future__ import annotations

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
from sessions_app.models import Event, Session
from sessions_app.services.usage import format_cost

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
    }
)
STATUS_LABELS = {"idle": "idle", "running": "running", "waiting_approval": "waiting for approval"}
# What a batch of events must contain for the page's approvals to change.
APPROVAL_MOVES = frozenset({"approval/requested", "approval/resolved", "turn/start", "turn/end"})


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
    def data_json(self) -> str:
        return json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))


def event_row(seq: int, kind: str, data: dict[str, Any], at: Any, inbox_seq: int) -> EventRow:
    return EventRow(seq, kind, data, at, queued=(kind == "input/queued" and seq > inbox_seq))


def render_event(row: EventRow, *, oob: str = "") -> str:
    return render_to_string("sessions/chat.html#event", {"ev": row, "oob": oob})


# ---------------------------------------------------------------- the chat page's socket


@dataclass
class ChatFollower:
    """What one chat page's socket has shown, so each batch sends only what changed."""

    session_id: uuid.UUID
    user: Any
    stream_step: int | None = None  # the step whose deltas the bubble shows
    closed_step: int = 0  # the latest step whose assistant/message was sent: its late deltas are dropped
    step: int = 0

    def events(self, frames: list[tuple[int, str]]) -> str:
        """The fragments for a batch of committed events (socket frames):
        each event appended to the log, queued inputs that landed shown as
        landed, and the header, the approvals and the bubble brought up to date."""
        session = Session.objects.filter(id=self.session_id).select_related("owner").first()
        if session is None:
            return ""
        parsed = [json.loads(text) for _, text in frames]
        out = []
        landed: list[int] = []
        kinds = set()
        for f in parsed:
            kinds.add(f["kind"])
            data = f.get("data") or {}
            row = event_row(f["seq"], f["kind"], data, datetime.fromisoformat(f["at"]), session.inbox_seq)
            out.append(f'<ol hx-swap-oob="beforeend:#log">{render_event(row)}</ol>')
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
                    out.append(self.bubble(None, ""))
            elif f["kind"] == "turn/end":
                self.closed_step = max(self.step, self.stream_step or 0)
                out.append(self.bubble(None, ""))
            elif f["kind"] in ("user/message", "context/injected") and data.get("source_seq"):
                landed.append(int(data["source_seq"]))
        for seq, kind, data, at in Event.objects.filter(session_id=self.session_id, seq__in=landed).values_list(
            "seq", "kind", "data", "created_at"
        ):
            out.append(render_event(event_row(seq, kind, data, at, session.inbox_seq), oob="outerHTML"))
        out.append(render_to_string("sessions/chat.html#facts", facts_context(session, self.user, oob=True)))
        if "session/titled" in kinds:
            out.append(render_to_string("sessions/chat.html#title", {"session": session, "oob": True}))
        if kinds & APPROVAL_MOVES:
            out.append(approvals_fragment(session, self.user))
        return "".join(out)

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


# ---------------------------------------------------------------- the dashboard's and the queue's sockets


def queue_fragment(user: Any) -> str:
    return render_to_string("approvals/queue.html#queue", {"queue": queue_for(user), "oob": True})
