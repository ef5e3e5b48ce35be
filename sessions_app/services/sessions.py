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
from sessions_app.errors import InvalidInput
from sessions_app.log.catalogue import MODEL_ROLES
from sessions_app.models import Agent, AgentProfile, Session
from sessions_app.runtime import dispatch, registry


def create_session(owner: Any, profile: AgentProfile, *, agent_id: str | None = None) -> Session:
    """A new session of `profile`. Its agent is spawned by the first drive
    that finds work for it (runtime/registry.py); with `agent_id`, a named
    agent is spawned now."""
    with transaction.atomic():
        session = Session.objects.create(owner=owner, profile=profile)
        if agent_id is not None:
            registry.spawn(session, profile, agent_id=agent_id)
    return session


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
