"""Agent versions on behalf of people: a session's upgrade (through the
pre-flight), a profile's sessions upgraded in bulk, and what a profile's
versions and a session's version look like (runtime/versions.py keeps the
versions themselves)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, QuerySet

from sessions_app import log
from sessions_app.errors import InvalidInput, NoProfile, UpgradeRefused
from sessions_app.log.reads import turn_events
from sessions_app.models import AgentProfile, AgentVersion, Session
from sessions_app.runtime import dispatch, versions
from sessions_app.runtime.registry import lease_live


@dataclass(frozen=True)
class SessionVersion:
    """The version a session runs under (before its first turn: the one that
    turn would open on), and its profile's newest."""

    number: int
    digest: str
    latest: int

    def as_json(self) -> dict[str, Any]:
        return {"number": self.number, "digest": self.digest, "latest": self.latest}


def version_of(session: Session) -> SessionVersion | None:
    """The session's SessionVersion; None when it has no profile."""
    if session.profile_id is None:
        return None
    newest = versions.latest(session.profile_id)
    if newest is None:
        return None
    number = session.agent_version
    if number is None:
        number = versions.opening(session.profile_id, None).version.number  # type: ignore[union-attr]
    own = versions.get(session.profile_id, number) or newest
    return SessionVersion(own.number, own.digest, newest.number)


def upgrade(session_id: uuid.UUID | str, to: int | None, *, by: str) -> versions.Version:
    """Move the session to version `to` of its profile (None: the newest):
    session/upgraded {from, to, by} (versions.upgraded). An open turn (parked, blocked, waiting
    on an operator) goes on under `to`; the pre-flight refuses, changing
    nothing, when that would strand an owed call or a pending approval, or
    when a worker drives the turn right now (UpgradeRefused). Moving to the
    version it is on writes nothing. Under `next_turn` the next turn still
    opens on the newest version; under `pinned` the session stays on `to`."""
    if to is not None and (isinstance(to, bool) or not isinstance(to, int) or to < 1):
        raise InvalidInput("to must be a version number (1, 2, ...) or null for the newest")
    with log.locked(session_id) as tx:
        profile_id = tx.row["profile_id"]
        if profile_id is None:
            raise NoProfile(f"session {tx.session_id} names no agent profile")
        target = versions.latest(profile_id) if to is None else versions.get(profile_id, to)
        if target is None:
            raise InvalidInput(f"the profile has no version {to}")
        current = tx.row["agent_version"]
        if current == target.number:
            return target
        reasons = _preflight(tx, current, target)
        if reasons:
            raise UpgradeRefused(f"the upgrade to version {target.number} would strand work", reasons=reasons)
        if tx.row["open_turn_seq"] is not None and tx.fence_out():
            dispatch.wake(tx.session_id)  # a lapsed holder drives no more of it under the old version
        tx.append("session/upgraded", versions.upgraded(profile_id, current, target, by))
    return target


def _preflight(tx: log.SessionTx, current: int | None, target: versions.Version) -> list[str]:
    turn_seq = tx.row["open_turn_seq"]
    if turn_seq is None:
        return []
    if lease_live(tx.row):
        return ["a worker is driving the open turn: it moves at the turn's end, or once it parks or blocks"]
    mine = versions.get(target.profile_id, current) if current is not None else None
    return versions.strands(turn_events(tx.session_id, turn_seq), mine, target)


@dataclass
class BulkUpgrade:
    """A profile's sessions upgraded: those moved, and those the pre-flight refused (with its reasons)."""

    to: int
    upgraded: list[str] = field(default_factory=list)
    refused: dict[str, list[str]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"to": self.to, "upgraded": self.upgraded, "refused": self.refused}


def upgrade_profile(profile: AgentProfile, to: int | None, *, by: str) -> BulkUpgrade:
    """Every session of `profile` not on version `to` (None: the newest),
    each through its own pre-flight; the refused ones are reported, not raised."""
    target = versions.latest(profile.pk) if to is None else versions.get(profile.pk, to)
    if target is None:
        raise InvalidInput(f"profile {profile.name!r} has no version {to}")
    out = BulkUpgrade(target.number)
    stale = Session.objects.filter(profile=profile).exclude(agent_version=target.number)
    for sid in stale.values_list("id", flat=True).order_by("created_at").iterator():
        try:
            upgrade(sid, target.number, by=by)
        except UpgradeRefused as exc:
            out.refused[str(sid)] = exc.reasons
        else:
            out.upgraded.append(str(sid))
    return out


@dataclass(frozen=True)
class VersionRow:
    """One version of a profile, with how many sessions run on it."""

    number: int
    digest: str
    created_at: Any
    snapshot: dict[str, Any]
    sessions: int

    def as_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "digest": self.digest,
            "created_at": self.created_at.isoformat(),
            "snapshot": self.snapshot,
            "sessions": self.sessions,
        }


def versions_of(profile: AgentProfile, sessions: QuerySet[Session] | None = None) -> list[VersionRow]:
    """The profile's versions, newest first, each with its count of
    `sessions` (default: all) on it."""
    counts = dict(
        (Session.objects.all() if sessions is None else sessions)
        .filter(profile=profile, agent_version__isnull=False)
        .values_list("agent_version")
        .annotate(n=Count("id"))
        .values_list("agent_version", "n")
    )
    rows = AgentVersion.objects.filter(profile=profile).order_by("-number")
    return [VersionRow(v.number, v.digest, v.created_at, v.snapshot, counts.get(v.number, 0)) for v in rows]
