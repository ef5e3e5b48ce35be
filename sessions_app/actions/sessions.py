"""Sessions: profiles to start from, a new session, its detail and health,
the log's events, and driving it (cancel, retry, compact, a model role)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from approvals_app import selectors as approvals
from sessions_app import services
from sessions_app.actions.access import by, session_for
from sessions_app.errors import InvalidInput, UnknownSession
from sessions_app.llm.providers import unreachable
from sessions_app.log.reads import blocked_info, events_page, rows_before, stalled_since, usage, waiting_info
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.permissions import can_approve, can_drive
from sessions_app.services import budgets as budget_services
from sessions_app.services import compaction
from sessions_app.services import sessions as session_services
from sessions_app.services import storage as storage_services
from sessions_app.services import tasks as task_services
from sessions_app.services import versions as version_services
from sessions_app.services.operators import turn_progress
from sessions_app.services.versions import SessionVersion
from sessions_app.validation import int_in_column


def usable_profiles(user: Any) -> QuerySet[AgentProfile]:
    """Profiles `user` may start sessions with. Profiles carry no access
    rules yet, so any active user may use every profile."""
    if not (user and user.is_authenticated and user.is_active):
        return AgentProfile.objects.none()
    return AgentProfile.objects.order_by("name")


def list_profiles(user: Any) -> list[AgentProfile]:
    """The profiles `user` may start sessions with, by name."""
    return list(usable_profiles(user).only("name", "description"))


def create_session(user: Any, profile: str) -> Session:
    """A new session of `user`'s from the profile named `profile`."""
    found = usable_profiles(user).filter(name=profile).first()
    if found is None:
        raise InvalidInput(f"unknown profile {profile[:64]!r}; GET /api/profiles lists yours")
    return services.create_session(user, found)


def _iso(info: dict[str, Any] | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {**info, "since": info["since"].isoformat()}


def health(session: Session) -> dict[str, Any]:
    """status, and `blocked` {reason, attempts, since} / `waiting` {reason,
    since} (each None unless the session is in that state), the open
    turn's count of unresolved attempts of unknown outcome, and
    `stalled_since` (None unless its turn/stalled stands), JSON-ready."""
    stalled = stalled_since(session)
    return {
        "status": session.status,
        "blocked": _iso(blocked_info(session)),
        "waiting": _iso(waiting_info(session)),
        "unknown_effects": session.unknown_effects,
        "stalled_since": stalled.isoformat() if stalled else None,
    }


@dataclass(frozen=True)
class SessionDetail:
    """A session as its reader sees it: the row (status, title, head), its
    usage totals, the calls waiting for a verdict, its budget, and the open
    turn's progress."""

    session: Session
    usage: dict[str, Any]
    pending: list[Any]
    budget: dict[str, Any]
    progress: Any  # services.operators.turn_progress: the open turn's progress
    version: SessionVersion | None = None
    parent: dict[str, str] | None = None  # a subagent's child session: {session_id, task_id}

    def as_json(self) -> dict[str, Any]:
        session, totals = self.session, self.usage
        return {
            "id": str(session.id),
            "profile": session.profile.name if session.profile else None,
            **health(session),
            "title": session.title,
            "usage": {
                "prompt_tokens": totals["prompt_tokens"],
                "completion_tokens": totals["completion_tokens"],
                "cost": float(totals["cost"]),
                "steps": totals["steps"],
                "unpriced": totals["unpriced"],
            },
            "last_seq": session.last_seq,
            "pending_approvals": [{**p.as_json(), "seq": p.seq} for p in self.pending],
            "budget": self.budget,
            "progress": self.progress.as_json(),
            "version": self.version.as_json() if self.version is not None else None,
            "storage": storage_services.storage_of(session),
            "parent": self.parent,
        }


def session_detail(user: Any, session_id: Any) -> SessionDetail:
    # The row only: a cold session stays cold while its storage is reported.
    session = session_for(user, session_id, "view", thaw=False)
    return SessionDetail(
        session=session,
        usage=usage(session),
        pending=list(approvals.pending(session.id)),
        budget=budget_services.budget_of(session.id),
        progress=turn_progress(session),
        version=version_services.version_of(session),
        parent=task_services.parent_of(session.id),
    )


def set_storage(user: Any, session_id: Any, tier: Any) -> dict[str, Any]:
    """Move a session's events cold or hot (staff: docs/storage.md); its
    storage after, as GET /api/sessions/{id} shows it. Logged with the actor."""
    session = session_for(user, session_id, "operate", thaw=False)
    storage_services.set_tier(session.id, tier, by=user.get_username())
    session.refresh_from_db()
    return storage_services.storage_of(session)


def socket_access(user: Any, session_id: Any) -> dict[str, Any]:
    """What a socket for this session may do (raises like session_for)."""
    session = session_for(user, session_id, "view")
    return {"session": session.id, "can_drive": can_drive(user, session), "can_approve": can_approve(user, session)}


def head(session_id: uuid.UUID) -> int:
    value = Session.objects.filter(id=session_id).values_list("last_seq", flat=True).first()
    if value is None:
        raise UnknownSession(f"no session {session_id}")
    return int(value)


def live_state(session_id: uuid.UUID) -> dict[str, Any]:
    """The log head and the session's health (see `health`), from one read of
    the session row, so the status describes the log exactly up to last_seq."""
    session = Session.objects.filter(id=session_id).first()
    if session is None:
        raise UnknownSession(f"no session {session_id}")
    found = version_services.version_of(session)
    return {"last_seq": session.last_seq, **health(session), "version": found.as_json() if found else None}


@dataclass(frozen=True)
class EventsPage:
    """Events of the log after a seq, bounded in count and bytes; `next_after`
    is where the next page starts (None when this one reached the head)."""

    events: list[dict[str, Any]]
    last_seq: int
    next_after: int | None

    def as_json(self) -> dict[str, Any]:
        return {"events": self.events, "last_seq": self.last_seq, "next_after": self.next_after}


def events(user: Any, session_id: Any, after: int, limit: int) -> EventsPage:
    """A page of the log after `after`: at most `limit` events and at most
    TERRET_READ_MAX_BYTES of them (log.reads.events_page)."""
    session = session_for(user, session_id, "view")
    after = int_in_column("after", after, Event._meta.get_field("seq"), minimum=0)
    page = events_page(session.id, after, limit)
    # Read the head after the page, so last_seq >= every seq returned.
    last_seq = head(session.id)
    tail = page[-1]["seq"] if page else after
    return EventsPage(page, last_seq, tail if tail < last_seq else None)


def chat_rows(session: Session, *, before: int | None, upto: int, limit: int) -> list[tuple[int, str, Any, Any]]:
    """The chat page's rows of a session its caller may view (session_for
    found it): the `limit` events before `before` (or up to `upto`), oldest
    first, each payload lifted to the catalogue's version (log.reads.rows_before)."""
    return rows_before(session.id, before=before, upto=upto, limit=limit)


@dataclass(frozen=True)
class Cancelled:
    """`cancelled`: a turn was open; `closed`: it has already ended (no worker
    held it, so the cancel closed it at once); otherwise the worker driving
    it stops its model stream within about a second."""

    cancelled: bool
    closed: bool

    def as_json(self) -> dict[str, Any]:
        return {"cancelled": self.cancelled, "closed": self.closed}


def cancel(user: Any, session_id: Any) -> Cancelled:
    """Cancel the open turn."""
    session = session_for(user, session_id, "drive")
    cancelled = services.cancel(session.id, by=by(user))
    closed = False
    if cancelled:
        row = Session.objects.filter(id=session.id).values_list("open_turn_seq", "cancel_seq").first()
        # turn/end clears cancel_seq: an open turn without one is a later turn, so ours has ended.
        closed = row is None or row[0] is None or row[1] is None
    return Cancelled(cancelled, closed)


@dataclass(frozen=True)
class StatusAfter:
    """A session's status once an action was recorded."""

    status: str
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {**self.extra, "status": self.status}


def status_now(session: Session) -> str:
    fresh = Session.objects.filter(id=session.id).first()
    return (fresh or session).status


def retry(user: Any, session_id: Any) -> StatusAfter:
    """Drive a blocked turn again now (NotBlocked, 409, when it is not blocked)."""
    session = session_for(user, session_id, "drive")
    services.retry(session.id, by=by(user))
    return StatusAfter(status_now(session))


@dataclass(frozen=True)
class Compaction:
    """What a manual compaction did: its session/compacted seq and the seq it
    summarizes up to, or why it declined."""

    compacted: bool
    seq: int | None = None
    upto_seq: int | None = None
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"compacted": self.compacted, "seq": self.seq, "upto_seq": self.upto_seq, "reason": self.reason}


def compact(user: Any, session_id: Any) -> Compaction:
    """Compact now. Runs the summarizer in the caller's thread (seconds)."""
    session = session_for(user, session_id, "drive")
    outcome = compaction.attempt(session.id, manual=True)
    if isinstance(outcome, compaction.CompactionResult):
        return Compaction(True, outcome.seq, outcome.upto_seq)
    return Compaction(False, reason=outcome.reason)


@dataclass(frozen=True)
class ModelRole:
    """A model role set for a session (its session/model event)."""

    role: str
    spec: str
    seq: int

    def as_json(self) -> dict[str, Any]:
        return {"role": self.role, "spec": self.spec, "seq": self.seq}


def set_model(user: Any, session_id: Any, role: str, spec: str) -> ModelRole:
    """Repoint a role; a model no provider can reach (no API key) is refused
    here, before a turn fails on it with a transport error."""
    session = session_for(user, session_id, "drive")
    problem = unreachable(spec) if isinstance(spec, str) and spec.strip() else None
    if problem:
        raise InvalidInput(problem)
    event = services.set_model(session.id, role, spec, by=by(user))
    return ModelRole(event.data["role"], event.data["spec"], event.seq)


def rename(user: Any, session_id: Any, title: str) -> int:
    """A new title by the user (session/titled; the latest wins): its seq."""
    session = session_for(user, session_id, "drive")
    return session_services.rename_session(session.id, title, by=by(user)).seq


def archive(user: Any, session_id: Any) -> Session:
    """Hide the session from the list and dispose of its agent."""
    session = session_for(user, session_id, "drive")
    return session_services.archive_session(session.id, by=by(user))


def unarchive(user: Any, session_id: Any) -> Session:
    session = session_for(user, session_id, "drive")
    return session_services.unarchive_session(session.id, by=by(user))
