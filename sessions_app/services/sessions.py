"""Writes on behalf of people: sessions, their live agents, model roles.

Each function validates, then takes the row lock it needs for the
check-then-act, appends through the log, and leaves external effects to run
on commit.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from sessions_app import log
from sessions_app.errors import AgentBusy, InvalidInput
from sessions_app.log.catalogue import MODEL_ROLES
from sessions_app.models import Agent, AgentProfile, Session
from sessions_app.runtime import dispatch, registry
from sessions_app.runtime.owned import store as owned
from sessions_app.services import schedules, titling
from sessions_app.validation import clean_text


def create_session(owner: Any, profile: AgentProfile, *, agent_id: str | None = None) -> Session:
    """A new session of `profile`. Its agent is spawned by the first drive
    that finds work for it (runtime/registry.py); with `agent_id`, a named
    agent is spawned now."""
    with transaction.atomic():
        session = Session.objects.create(owner=owner, profile=profile)
        if agent_id is not None:
            registry.spawn(session, profile, agent_id=agent_id)
    return session


def create_unbound_session(owner: Any) -> Session:
    """A session with no profile yet (the LangGraph door's thread created
    without a graph id): its first run binds it (bind_profile)."""
    return Session.objects.create(owner=owner, profile=None)


def bind_profile(session_id: uuid.UUID | str, profile: AgentProfile) -> bool:
    """Give an unbound session its profile; False if it had one already (the
    update is conditional, so two first runs racing bind it once)."""
    return Session.objects.filter(id=session_id, profile__isnull=True).update(profile=profile) == 1


def spawn_agent(session: Session, profile: AgentProfile, *, agent_id: str | None = None) -> Agent:
    return registry.spawn(session, profile, agent_id=agent_id)


def dispose_agent(agent_id: str, *, reason: str = "operator", by: str = "") -> None:
    """Dispose an idle agent (AgentBusy if it is not), then hand its slot to
    a session waiting for one."""
    registry.dispose(agent_id, reason=reason, by=by)
    for sid in registry.offer_slots():
        dispatch.wake(sid)


def set_model(session_id: uuid.UUID | str, role: str, spec: str, *, by: str = "") -> log.AppendedEvent:
    """Repoint a model role for this session, in force from the next step."""
    if role not in MODEL_ROLES:
        raise InvalidInput(f"role must be one of {', '.join(MODEL_ROLES)}")
    if not isinstance(spec, str) or not spec.strip() or len(spec) > 200:
        raise InvalidInput("spec must be a non-empty model name")
    data = {"role": role, "spec": spec.strip()}
    if by:
        data["by"] = by
    return log.append(session_id, "model/updated", data)


# ---------------------------------------------------------------- rename, archive


def rename_session(session_id: uuid.UUID | str, title: str, *, by: str) -> log.AppendedEvent:
    """A new `session/titled` by a person. The title column follows the
    latest one, so this wins over the titler's (which only titles a session
    that has none) and over any earlier rename."""
    clean = titling.clean(clean_text("a title", title))
    if not clean:
        raise InvalidInput("a title needs some text (one line, at most 80 characters)")
    if len(" ".join(str(title).split())) > titling.TITLE_MAX:
        raise InvalidInput(f"a title has at most {titling.TITLE_MAX} characters")
    data = {"title": clean}
    if by:
        data["by"] = by
    return log.append(session_id, "session/titled", data)


def archive_session(session_id: uuid.UUID | str, *, by: str) -> Session:
    """Hide the session from the list and dispose of its agent. Refused while
    a turn is open (stop it first): a running agent cannot be disposed, and
    archiving should not leave work going on out of sight. Its schedules are
    cancelled. A session/archived records it (the list reads `archived_at`,
    its projection); the session stays readable, and unarchive_session
    (session/unarchived) brings it back."""
    with log.locked(session_id) as tx:
        if tx.row.get("open_turn_seq") is not None:
            raise InvalidInput("a turn is running: stop it before archiving the session")
        if not Session.objects.filter(id=tx.session_id, archived_at__isnull=False).exists():
            tx.append("session/archived", {"by": by} if by else {})
    agent = Agent.objects.filter(session_id=session_id).values_list("agent_id", flat=True).first()
    if agent is not None:
        try:
            dispose_agent(agent, reason="operator", by=by)
        except (AgentBusy, InvalidInput):
            pass  # a turn started meanwhile, or the sweep disposed it first: it goes idle in time
    _cancel_schedules(session_id, by=by)
    owned.abort_session(session_id, f"archived by {by}" if by else "archived")  # the full-stop policy
    return Session.objects.get(id=session_id)


def unarchive_session(session_id: uuid.UUID | str, *, by: str) -> Session:
    """Show the session in the list again; its agent respawns on the next input."""
    with log.locked(session_id) as tx:
        if Session.objects.filter(id=tx.session_id, archived_at__isnull=False).exists():
            tx.append("session/unarchived", {"by": by} if by else {})
    return Session.objects.get(id=session_id)


def _cancel_schedules(session_id: uuid.UUID | str, *, by: str) -> None:
    schedules.cancel_for_session(session_id, reason="session archived", by=by)
