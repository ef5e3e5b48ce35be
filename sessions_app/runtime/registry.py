"""The agent registry: which sessions have a live agent, within the cap.

The seed's registry is a map in one process: spawn refuses an id already
live (AgentExists), dispose refuses a busy agent, and a blast-radius cap
bounds how many live at once. Terret keeps the same rules across processes
with `Agent` rows: the rows are the map, every spawn and disposal holds the
registry lock (a PostgreSQL advisory transaction lock; SQLite's IMMEDIATE
transactions serialize writers anyway) so the count under the cap cannot
race, and each one is logged in its session (agent/spawned, agent/disposed).

An agent is spawned on demand, when a drive finds work for a session that
has none, and disposed of when it has been idle for TERRET_AGENT_IDLE_SECONDS
(`reap_idle`, run by the sweep) or when a slot is needed for another
session's work (eviction, least recently active first). Sessions are
unlimited; the cap bounds only what is live. When every live agent is busy,
the session's input stays durably where it is and the session waits
(agent/waiting); `offer_slots` hands freed slots to waiting sessions, oldest
first. docs/runtime.md has the mapping in full.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import AgentBusy, AgentExists, InvalidInput, NoProfile
from sessions_app.log.reads import latest_of_kind
from sessions_app.log.records import Fence
from sessions_app.models import Agent, AgentProfile, Session

logger = logging.getLogger(__name__)

REGISTRY_LOCK = 0x7E44E7
EVICT_CANDIDATES = 8
OFFER_BATCH = 64
REAP_BATCH = 100


def _lock(*, wait: bool = True) -> bool:
    """Take the registry lock for this transaction; with wait=False only if it
    is free (False: another process holds it). The cap is a check-then-act
    across rows: every spawn and disposal is serialized.

    The sweep's housekeeping (reaping, offering slots) does not wait: it
    runs in every worker every round, and a holder that stops between its
    lock and its commit (SIGSTOP, a frozen VM) would otherwise stall every
    other worker's sweep behind it, and with it the wake-ups the sweep
    exists to resend. The next round tries again."""
    if connection.vendor != "postgresql":
        return True  # SQLite: IMMEDIATE transactions serialize writers anyway
    with connection.cursor() as cur:
        if wait:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [REGISTRY_LOCK])
            return True
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [REGISTRY_LOCK])
        return bool(cur.fetchone()[0])


def lease_live(row: dict[str, Any]) -> bool:
    expires = row["lease_expires_at"]
    return bool(row["lease_owner"]) and expires is not None and expires > timezone.now()


def idle(row: dict[str, Any]) -> bool:
    """No open turn, no live lease, nothing queued: disposing loses nothing."""
    return (
        row["open_turn_seq"] is None
        and not lease_live(row)
        and row["last_input_seq"] <= row["inbox_seq"]
        and row["queued_follow_ups"] == 0
    )


def agent_id_for(session: Session, profile: AgentProfile) -> str:
    """The id an agent of this session is (re)spawned with: the one it had before, if any."""
    last = latest_of_kind(session.id, "agent/spawned")
    if last is not None:
        return str(last.data["agent_id"])
    return f"{profile.name}-{session.id.hex[:12]}"


def ensure_agent(session_id: uuid.UUID, fence: Fence | None = None) -> AgentProfile | None:
    """The profile of the session's live agent, spawning one if it has none
    (evicting an idle agent when the registry is full). None: no slot could
    be made; the session waits, logged once as agent/waiting. NoProfile when
    the session names no profile."""
    agent = Agent.objects.select_related("profile").filter(session_id=session_id).first()
    if agent is not None:
        return agent.profile
    session = Session.objects.select_related("profile").get(id=session_id)
    if session.profile is None:
        raise NoProfile(f"session {session_id} names no agent profile")
    if session.waiting_seq is not None:
        # In the queue already: offer_slots hands slots out, oldest first, so
        # a repeated wake-up neither jumps the queue nor contends for the lock.
        return None
    with transaction.atomic():
        _lock()
        if Agent.objects.filter(session_id=session_id).exists():
            return session.profile  # spawned for it meanwhile (offer_slots)
        live = Agent.objects.count()
        if live >= settings.TERRET_MAX_AGENTS and not _evict_one(exclude=session_id):
            if session.waiting_seq is None:
                reason = f"the registry is full: {live} live agents, all busy"
                log.append(session_id, "agent/waiting", {"reason": reason, "live": live}, fence=fence)
            return None
        _spawn(session, session.profile, agent_id_for(session, session.profile), fence)
        return session.profile


def spawn(session: Session, profile: AgentProfile, *, agent_id: str | None = None) -> Agent:
    """Spawn a named agent now (AgentExists if the id or the session has one;
    AgentBusy if the registry is full of busy agents)."""
    with transaction.atomic():
        _lock()
        existing = Agent.objects.filter(session=session).first()
        if existing is not None:
            raise AgentExists(f"session {session.id} already has agent {existing.agent_id!r}")
        if Agent.objects.count() >= settings.TERRET_MAX_AGENTS and not _evict_one(exclude=session.id):
            raise AgentBusy(f"the registry is full ({settings.TERRET_MAX_AGENTS} live agents, all busy)")
        if session.profile_id != profile.pk:
            Session.objects.filter(id=session.id).update(profile=profile)
        return _spawn(session, profile, agent_id or agent_id_for(session, profile), None)


def _spawn(session: Session, profile: AgentProfile, agent_id: str, fence: Fence | None) -> Agent:
    if Agent.objects.filter(agent_id=agent_id).exists():
        raise AgentExists(f"agent id {agent_id!r} is taken")
    agent = Agent.objects.create(agent_id=agent_id, session=session, profile=profile)
    live = Agent.objects.count()
    log.append(session.id, "agent/spawned", {"agent_id": agent_id, "profile": profile.name, "live": live}, fence=fence)
    return agent


def dispose(agent_id: str, *, reason: str = "operator", by: str = "") -> None:
    """Dispose an idle agent (AgentBusy otherwise) and free its slot; the
    caller hands the slot on (offer_slots, then wake what it returns)."""
    with transaction.atomic():
        _lock()
        agent = Agent.objects.filter(agent_id=agent_id).first()
        if agent is None:
            raise InvalidInput(f"no live agent {agent_id!r}")
        if not _dispose(agent, reason, by):
            raise AgentBusy(f"agent {agent_id!r} is not idle")


def _dispose(agent: Agent, reason: str, by: str = "") -> bool:
    """Under the registry lock: dispose `agent` if its session is idle."""
    with log.locked(agent.session_id) as tx:
        if not idle(tx.row):
            return False
        Agent.objects.filter(pk=agent.pk).delete()
        data = {"agent_id": agent.agent_id, "reason": reason}
        if by:
            data["by"] = by
        tx.append("agent/disposed", data)
    return True


def _idle_agents() -> Any:
    now = timezone.now()
    return (
        Agent.objects.filter(
            session__open_turn_seq__isnull=True,
            session__last_input_seq__lte=F("session__inbox_seq"),
            session__queued_follow_ups=0,
        )
        .filter(Q(session__lease_owner="") | Q(session__lease_expires_at__lte=now))
        .select_related("session")
    )


def _evict_one(*, exclude: uuid.UUID) -> bool:
    """Under the registry lock: dispose the least recently active idle agent."""
    for agent in _idle_agents().exclude(session_id=exclude).order_by("session__last_event_at")[:EVICT_CANDIDATES]:
        if _dispose(agent, "evicted"):
            return True
    return False


def reap_idle() -> int:
    """Dispose agents idle for longer than TERRET_AGENT_IDLE_SECONDS; returns
    how many. The sweep's: it skips a round when the registry lock is held."""
    cutoff = timezone.now() - timedelta(seconds=settings.TERRET_AGENT_IDLE_SECONDS)
    done = 0
    with transaction.atomic():
        if not _lock(wait=False):
            return 0
        for agent in _idle_agents().filter(session__last_event_at__lt=cutoff)[:REAP_BATCH]:
            done += _dispose(agent, "idle")
    return done


def has_waiting() -> bool:
    return Session.objects.filter(waiting_seq__isnull=False).exists()


def offer_slots(limit: int = OFFER_BATCH, *, wait: bool = True) -> list[str]:
    """Spawn agents for waiting sessions, oldest first, while a slot is free
    or can be freed by evicting an idle agent; returns their ids, for the
    caller to wake (the slot is theirs now: no other waker takes it).
    wait=False (the sweep): none when the registry lock is held."""
    if not has_waiting():
        return []
    offered: list[str] = []
    with transaction.atomic():
        if not _lock(wait=wait):
            return []
        free = settings.TERRET_MAX_AGENTS - Agent.objects.count()
        waiting = Session.objects.select_related("profile").filter(waiting_seq__isnull=False, agent__isnull=True)
        for session in waiting.order_by("last_event_at")[:limit]:
            if session.profile is None:
                continue
            if free <= 0 and not _evict_one(exclude=session.id):
                break
            free = max(free - 1, 0)
            _spawn(session, session.profile, agent_id_for(session, session.profile), None)
            offered.append(str(session.id))
    return offered
