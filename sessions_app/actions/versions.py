"""Agent versions: a session's upgrade, a profile's versions, and a
profile's sessions upgraded in bulk (operators)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sessions_app.actions.access import by, operator, session_for, visible
from sessions_app.actions.sessions import usable_profiles
from sessions_app.errors import InvalidInput
from sessions_app.models import AgentProfile, Session
from sessions_app.permissions import is_operator
from sessions_app.runtime import versions as runtime_versions
from sessions_app.services import versions
from sessions_app.services.versions import BulkUpgrade, SessionVersion, VersionRow


def upgrade(user: Any, session_id: Any, to: int | None) -> SessionVersion:
    """Move the session to version `to` of its profile (None: the newest),
    for its owner or staff; UpgradeRefused (409) when the pre-flight finds
    work it would strand."""
    session = session_for(user, session_id, "drive")
    versions.upgrade(session.id, to, by=by(user))
    found = versions.version_of(Session.objects.get(id=session.id))
    assert found is not None  # the upgrade found the profile's versions
    return found


# What an MCP server's configuration may carry that is not every user's to
# read (a token in its environment or a header): shown as keys only.
_SECRET_PARTS = ("env", "headers")


def profile_versions(user: Any, name: str) -> list[VersionRow]:
    """The versions of a profile `user` may use, newest first. Each counts
    only the sessions `user` may view, and to anyone but an operator the MCP
    servers' environment and header values are masked."""
    rows = versions.versions_of(_profile(user, name), visible(user, Session.objects.all()))
    if is_operator(user):
        return rows
    return [replace(row, snapshot=_masked(row.snapshot)) for row in rows]


def _masked(snapshot: dict[str, Any]) -> dict[str, Any]:
    profile = dict(snapshot.get("profile") or {})
    servers = profile.get("mcp_servers")
    if isinstance(servers, list):
        profile["mcp_servers"] = [
            {k: ({n: "***" for n in v} if k in _SECRET_PARTS and isinstance(v, dict) else v) for k, v in s.items()}
            if isinstance(s, dict)
            else s
            for s in servers
        ]
    return {**snapshot, "profile": profile}


def upgrade_profile(user: Any, name: str, to: int | None) -> BulkUpgrade:
    """Every session of the profile moved to `to` through its own
    pre-flight (operators); the refused ones are reported."""
    operator(user)
    return versions.upgrade_profile(_profile(user, name), to, by=by(user))


def _profile(user: Any, name: str) -> AgentProfile:
    found = usable_profiles(user).filter(name=name).first()
    if found is None:
        raise InvalidInput(f"unknown profile {name[:64]!r}; GET /api/profiles lists yours")
    return found


def session_version(session: Session) -> dict[str, Any] | None:
    """{number, digest, latest} of a session its reader was let in to already
    (the socket's hello, /lg/'s thread metadata); None: no profile."""
    found = versions.version_of(session)
    return found.as_json() if found is not None else None


def newest_version(profile: AgentProfile) -> int:
    """The number of the profile's newest version (/lg/'s assistant `version`)."""
    newest = runtime_versions.latest(profile.pk)
    return newest.number if newest is not None else 1
