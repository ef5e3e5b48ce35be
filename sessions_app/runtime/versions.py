"""Agent versions: every turn runs under one immutable definition of its profile.

A version (AgentVersion) is a snapshot of everything a turn depends on:
every concrete AgentProfile field except bookkeeping (BOOKKEEPING), so a
field added to the profile is covered without a change here, plus, for each
built-in tool the profile names, its input schema, approval mode and replay
policy as the tool registry gives them. MCP tools are listed by live
servers, so a version records their servers' configurations (profile
fields), not their tools: docs/events.md, "Agent versions".

`record` makes a new version whenever a profile's saved row has a digest
other than its newest version's (a post_save receiver, apps.py). A turn's
turn/start names its version (`opening`); the runtime drives the turn with
`profile_at` (an unsaved AgentProfile built from the snapshot), so an edit
made while the turn is parked, crashed or handed over does not reach it.
Versions are immutable, so snapshots are cached in-process by
(profile, number).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import jsonschema_rs
from django.db import transaction
from django.db.models import OuterRef, Subquery

from sessions_app.llm.types import ToolCall
from sessions_app.log.records import LoggedEvent
from sessions_app.models import AgentProfile, AgentVersion, Session
from sessions_app.tools.builtins import BUILTINS

# Profile fields that name or describe the profile, or govern its versions,
# and so change nothing a turn does.
BOOKKEEPING = frozenset({"id", "name", "description", "created_at", "upgrade_policy"})
POLICIES = ("next_turn", "pinned")


@dataclass(frozen=True)
class Version:
    profile_id: int
    number: int
    digest: str
    snapshot: dict[str, Any]

    def ref(self) -> dict[str, Any]:
        return {"number": self.number, "digest": self.digest}

    def tools(self) -> dict[str, dict[str, Any]]:
        return {t["name"]: t for t in self.snapshot.get("tools", [])}


def snapshot_of(profile: Any) -> dict[str, Any]:
    """The snapshot of a profile row (an AgentProfile, or a migration's
    historical model): its turn-relevant fields as JSON, and its built-in tools."""
    fields = {}
    for f in profile._meta.concrete_fields:
        if f.attname in BOOKKEEPING:
            continue
        value = getattr(profile, f.attname)
        if isinstance(value, Decimal) and getattr(f, "decimal_places", None) is not None:
            # The column's places: a value set in memory (Decimal("50")) and the
            # same value read back (Decimal("50.000000")) are one definition.
            value = value.quantize(Decimal(1).scaleb(-f.decimal_places))
        fields[f.attname] = value if isinstance(value, str | int | float | bool | list | dict | None) else str(value)
    return {"profile": fields, "tools": [_tool(name, profile.approvals or {}) for name in profile.builtin_tools or []]}


def _tool(name: Any, approvals: dict[str, Any]) -> dict[str, Any]:
    defn = BUILTINS.get(name) if isinstance(name, str) else None
    if defn is None:
        return {"name": str(name), "missing": True}
    approval = approvals.get(name, defn.approval)
    return {"name": name, "parameters": defn.parameters, "approval": approval, "replay": defn.replay_policy}


def digest_of(snapshot: dict[str, Any]) -> str:
    """sha256 of the snapshot's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def record(profile_id: int) -> AgentVersion | None:
    """A new version of the profile as its row stands, or None when the row's
    digest is its newest version's. The profile's row lock (SQLite: the
    IMMEDIATE transaction) serializes two saves at once, and the snapshot is
    read under it: of two racing saves, the second records nothing or the
    row both left, never a number twice."""
    with transaction.atomic():
        profile = AgentProfile.objects.select_for_update().filter(pk=profile_id).first()
        if profile is None:
            return None
        snapshot = snapshot_of(profile)
        digest = digest_of(snapshot)
        latest = AgentVersion.objects.filter(profile_id=profile_id).order_by("-number").first()
        if latest is not None and latest.digest == digest:
            return None
        number = 1 if latest is None else latest.number + 1
        return AgentVersion.objects.create(profile_id=profile_id, number=number, digest=digest, snapshot=snapshot)


def on_profile_saved(sender: Any, instance: AgentProfile, raw: bool = False, **_: Any) -> None:
    """post_save receiver: every save of a profile (admin, API, ORM) records a
    version if its definition changed. Fixture loading (raw) records none."""
    if not raw:
        record(instance.pk)


# -- reading versions ---------------------------------------------------------

_cache: dict[tuple[int, int], Version] = {}
_cache_lock = threading.Lock()


def get(profile_id: int, number: int) -> Version | None:
    """The version (cached: versions never change), or None."""
    key = (profile_id, number)
    with _cache_lock:
        found = _cache.get(key)
    if found is not None:
        return found
    row = AgentVersion.objects.filter(profile_id=profile_id, number=number).first()
    if row is None:
        return None
    version = Version(profile_id, row.number, row.digest, row.snapshot)
    with _cache_lock:
        _cache[key] = version
    return version


def forget() -> None:
    """Drop the cache (tests: a flushed database reuses profile pks)."""
    with _cache_lock:
        _cache.clear()


def latest(profile_id: int) -> Version | None:
    """The profile's newest version (recording one for a profile that has
    none, e.g. one made by bulk_create)."""
    number = AgentVersion.objects.filter(profile_id=profile_id).order_by("-number").values_list("number").first()
    if number is None:
        made = record(profile_id)
        return None if made is None else get(profile_id, made.number)
    return get(profile_id, number[0])


def profile_at(live: AgentProfile, number: int | None) -> AgentProfile:
    """The profile a turn of version `number` runs with: an unsaved instance
    with the live row's pk and bookkeeping and the snapshot's fields (a field
    the snapshot predates takes its default). The live row itself when
    `number` is None or unknown."""
    version = None if number is None else get(live.pk, number)
    if version is None:
        return live
    values = {name: getattr(live, name) for name in BOOKKEEPING}
    concrete = {f.attname: f for f in AgentProfile._meta.concrete_fields}
    for name, value in version.snapshot.get("profile", {}).items():
        if name in concrete:
            values[name] = concrete[name].to_python(value)
    profile = AgentProfile(**values)
    profile._state.adding = False
    profile._state.db = live._state.db
    return profile


def upgraded(profile_id: int, previous: int | None, target: Version, by: str) -> dict[str, Any]:
    """session/upgraded's payload: `from` and `to` as {number, digest}, the
    digests naming the exact definitions (a number alone is only an index
    into the profile's versions). A `from` whose version is gone keeps its
    number and a null digest."""
    before = get(profile_id, previous) if previous is not None else None
    if before is not None:
        source: dict[str, Any] | None = before.ref()
    else:
        source = None if previous is None else {"number": previous, "digest": None}
    return {"from": source, "to": target.ref(), "by": by}


# -- a turn's opening -----------------------------------------------------------


@dataclass(frozen=True)
class Opening:
    """The version a turn opens on, and the session's version before it."""

    version: Version | None
    previous: int | None

    def entries(self) -> list[tuple[str, dict[str, Any]]]:
        """session/upgraded when the opening moves the session (by policy)."""
        if self.version is None or self.previous is None or self.version.number == self.previous:
            return []
        return [("session/upgraded", upgraded(self.version.profile_id, self.previous, self.version, "policy"))]

    def stamp(self, data: dict[str, Any]) -> dict[str, Any]:
        """turn/start's payload with the version it opens on."""
        return data if self.version is None else {**data, "version": self.version.ref()}


def _newest(profile_column: str) -> Subquery:
    """The newest version's number of the profile whose id is the outer row's `profile_column`."""
    return Subquery(
        AgentVersion.objects.filter(profile_id=OuterRef(profile_column)).order_by("-number").values("number")[:1]
    )


def opening(profile_id: int | None, current: int | None) -> Opening:
    """The version a turn of a session on `profile_id`, now on `current`,
    opens on: the newest under `next_turn`, the current one under `pinned`
    (the newest for a session that has none yet). One read (the policy and
    the newest number); the version itself from the cache."""
    if profile_id is None:
        return Opening(None, current)
    head = (
        AgentProfile.objects.filter(pk=profile_id)
        .annotate(newest=_newest("pk"))
        .values_list("upgrade_policy", "newest")
        .first()
    )
    if head is None:
        return Opening(None, current)
    return _decide(profile_id, current, *head)


def opening_for_session(session_id: Any) -> Opening | None:
    """`opening` for a session not locked (admission's guarded fast path), in
    one read; its `previous` is the session's version as read. None: no such session."""
    head = (
        Session.objects.filter(id=session_id)
        .annotate(newest=_newest("profile_id"))
        .values_list("profile_id", "agent_version", "profile__upgrade_policy", "newest")
        .first()
    )
    if head is None:
        return None
    profile_id, current, policy, number = head
    if profile_id is None:
        return Opening(None, current)
    return _decide(profile_id, current, policy, number)


def _decide(profile_id: int, current: int | None, policy: str, number: int | None) -> Opening:
    version = None
    if policy == "pinned" and current is not None:
        version = get(profile_id, current)
    if version is None:
        version = get(profile_id, number) if number is not None else latest(profile_id)
    return Opening(version, current)


# -- the pre-flight -------------------------------------------------------------


def strands(events: list[LoggedEvent], current: Version | None, target: Version) -> list[str]:
    """What moving the open turn (its `events`, turn/start onward) from
    `current` to `target` would strand, one sentence each (none: []): an owed
    call (a tool call with no result yet, a pending approval included) whose
    built-in tool the target lacks or whose input schema rejects the call's
    arguments. A call to a tool neither version lists as built-in is an MCP
    tool: the target must still have MCP servers (the tools themselves are
    listed live; a missing one blocks at run time)."""
    results = {e.data["call_id"] for e in events if e.kind == "tool/result"}
    asked = {e.data["call_id"] for e in events if e.kind == "approval/requested"}
    decided = {e.data["call_id"] for e in events if e.kind == "approval/resolved"}
    owed = [
        ToolCall(c["id"], c["name"], c["arguments"])
        for e in events
        if e.kind == "assistant/message"
        for c in e.data.get("tool_calls") or []
        if c["id"] not in results
    ]
    tools = target.tools()
    was_builtin = set(current.tools()) if current is not None else set()
    reasons = []
    for call in owed:
        what = "pending approval" if call.id in asked and call.id not in decided else "owed call"
        problem = _problem(call, tools, was_builtin, target)
        if problem:
            reasons.append(f"{what} {call.id} ({call.name}): {problem} in version {target.number}")
    return reasons


def _problem(call: ToolCall, tools: dict[str, dict[str, Any]], was_builtin: set[str], target: Version) -> str:
    tool = tools.get(call.name)
    if tool is None or tool.get("missing"):
        if call.name in was_builtin or call.name in BUILTINS or not target.snapshot["profile"].get("mcp_servers"):
            return "the tool is absent"
        return ""  # an MCP tool: its server is still configured
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        return ""  # unreadable under any version: the upgrade strands nothing new
    error = _schema_error(tool, args)
    return "" if error is None else f"the input schema rejects its arguments ({error})"


def _schema_error(tool: dict[str, Any], args: Any) -> str | None:
    try:
        validator = jsonschema_rs.validator_for(tool.get("parameters") or {})
    except ValueError as exc:
        return str(exc)
    for error in validator.iter_errors(args):
        return error.message
    return None
