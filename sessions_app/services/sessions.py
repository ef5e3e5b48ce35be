"""Writes on behalf of people: sessions, their live agents, model roles.

Each function validates, then takes the row lock it needs for the
check-then-act, appends through the log, and leaves external effects to run
on commit.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import AgentBusy, AgentCapExceeded, AgentExists, InvalidInput
from sessions_app.log.catalogue import MODEL_ROLES
from sessions_app.models import Agent, AgentProfile, Session


def create_session(owner: Any, profile: AgentProfile, *, agent_id: str | None = None) -> Session:
    """A new session with its live agent spawned from `profile`."""
    with transaction.atomic():
        session = Session.objects.create(owner=owner, profile=profile)
        spawn_agent(session, profile, agent_id=agent_id)
    return session


def spawn_agent(session: Session, profile: AgentProfile, *, agent_id: str | None = None) -> Agent:
    agent_id = agent_id or f"{profile.name}-{session.id.hex[:12]}"
    with transaction.atomic():
        _lock_registry()
        if Agent.objects.filter(agent_id=agent_id).exists():
            raise AgentExists(f"agent id {agent_id!r} is taken")
        existing = Agent.objects.filter(session=session).first()
        if existing is not None:
            raise AgentExists(f"session {session.id} already has agent {existing.agent_id!r}")
        if Agent.objects.count() >= settings.TERRET_MAX_AGENTS:
            raise AgentCapExceeded(f"the registry is full ({settings.TERRET_MAX_AGENTS} live agents)")
        agent = Agent.objects.create(agent_id=agent_id, session=session, profile=profile)
        if session.profile_id != profile.pk:
            Session.objects.filter(id=session.id).update(profile=profile)
        log.append(session.id, "agent/spawned", {"agent_id": agent_id, "profile": profile.name})
    return agent


def _lock_registry() -> None:
    # The cap is a check-then-act across rows: serialize spawns. SQLite's
    # IMMEDIATE transactions already serialize every writer.
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [0x7E44E7])


def dispose_agent(agent_id: str) -> None:
    """Dispose an idle agent and free its registry slot."""
    agent = Agent.objects.filter(agent_id=agent_id).first()
    if agent is None:
        raise InvalidInput(f"no agent {agent_id!r}")
    with log.locked(agent.session_id) as tx:
        if tx.row["open_turn_seq"] is not None or lease_live(tx.row):
            raise AgentBusy(f"agent {agent_id!r} is not idle")
        Agent.objects.filter(pk=agent.pk).delete()
        tx.append("agent/disposed", {"agent_id": agent_id})


def lease_live(row: dict[str, Any]) -> bool:
    expires = row["lease_expires_at"]
    return bool(row["lease_owner"]) and expires is not None and expires > timezone.now()


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
