"""The tools one agent profile may use.

A registry is built from the profile's built-in tool names, the tools its MCP
servers list, and its approval overrides. Building one can mean starting MCP
servers, so registries are cached per process, keyed by the profile and a hash
of its tool configuration: a turn step reuses the cached one, and an admin
edit changes the hash and so takes effect on the next step.

MCP tools report their calls' progress notifications through the one
process-wide progress sink (`on_progress`), which the runtime points at the
session's live hints; the tools layer itself sends nothing anywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, cast, get_args

from sessions_app.llm.types import ToolSpec
from sessions_app.models import AgentProfile

from .base import Approval, Definition, ToolContext
from .builtins import BUILTINS

logger = logging.getLogger(__name__)

APPROVALS: frozenset[str] = frozenset(get_args(Approval))

# Where a tool call's progress goes: (session id, hint payload
# {"kind": "tool/progress", "call_id", "progress", "total"?, "message"?}).
ProgressReceiver = Callable[[Any, dict[str, Any]], None]
_progress_receiver: ProgressReceiver | None = None


def on_progress(receiver: ProgressReceiver | None) -> None:
    """Send every MCP tool call's progress notifications to `receiver` (the
    runtime sets it to the live-hint publisher; None drops them)."""
    global _progress_receiver
    _progress_receiver = receiver


def _report_progress(ctx: ToolContext, payload: dict[str, Any]) -> None:
    receiver = _progress_receiver
    if receiver is not None:
        receiver(ctx.session_id, payload)


class Registry(Mapping[str, Definition]):
    """An immutable mapping of tool name to Definition."""

    def __init__(
        self,
        definitions: Iterable[Definition] = (),
        *,
        degraded: bool = False,
        unavailable: Mapping[str, str] | None = None,
        absent: Iterable[str] = (),
    ) -> None:
        # Degraded: some MCP server's tools are missing because it was down.
        self.degraded = degraded
        # The MCP servers that were down, by name, with why; the built-in
        # tools the configuration names that the running code does not have.
        # What a turn that needs one of them is blocked on (runtime/definitions.py).
        self.unavailable: Mapping[str, str] = MappingProxyType(dict(unavailable or {}))
        self.absent: tuple[str, ...] = tuple(absent)
        items: dict[str, Definition] = {}
        for defn in definitions:
            if defn.name in items:
                raise ValueError(f"duplicate tool name {defn.name!r}")
            items[defn.name] = defn
        self._items = MappingProxyType(dict(sorted(items.items())))

    def __getitem__(self, name: str) -> Definition:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({list(self._items)})"

    def get(self, name: str, default: Any = None) -> Definition | None:  # type: ignore[override]
        return self._items.get(name, default)

    def names(self) -> list[str]:
        return list(self._items)

    def specs(self) -> list[ToolSpec]:
        return [ToolSpec(d.name, d.description, d.parameters) for d in self._items.values()]


def build_registry(
    builtin_tools: Iterable[str],
    mcp_servers: Iterable[Mapping[str, Any]] = (),
    approvals: Mapping[str, str] | None = None,
    *,
    strict: bool = True,
) -> Registry:
    """A registry from explicit configuration, uncached.

    Configuration mistakes raise ValueError. An MCP server that cannot be
    reached raises MCPUnavailable when `strict`; otherwise its tools are left
    out (and logged), the registry reports itself `degraded` and names the
    server in `unavailable`. Not `strict`, a built-in tool name the running
    code does not know (one a deploy removed) is left out and named in
    `absent`, for the runtime to block on rather than fail.
    """
    builtin_tools = list(builtin_tools)
    absent = [] if strict else [n for n in builtin_tools if isinstance(n, str) and n not in BUILTINS]
    definitions = [_builtin(name) for name in builtin_tools if name not in absent]
    mcp_servers = list(mcp_servers)
    if not mcp_servers:
        return Registry(_override(definitions, approvals or {}), degraded=False, absent=absent)
    # Imported here: the MCP SDK takes about half a second to import, which
    # a worker whose agents use only built-in tools should never pay.
    from . import mcp

    configs = [mcp.ServerConfig.parse(raw) for raw in mcp_servers]
    _check_unique([c.name for c in configs])
    unavailable: dict[str, str] = {}
    for config in configs:
        try:
            definitions.extend(mcp.list_tools(config, _report_progress))
        except mcp.MCPUnavailable as exc:
            if strict:
                raise
            logger.exception("MCP server %r is unavailable; its tools are left out for now", config.name)
            unavailable[config.name] = str(exc)
    return Registry(
        _override(definitions, approvals or {}), degraded=bool(unavailable), unavailable=unavailable, absent=absent
    )


def _check_unique(names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"two MCP servers are named {name!r}")
        seen.add(name)


def _builtin(name: Any) -> Definition:
    if not isinstance(name, str) or name not in BUILTINS:
        known = ", ".join(sorted(BUILTINS))
        raise ValueError(f"unknown built-in tool {name!r}; known built-ins: {known}")
    return BUILTINS[name]


def _override(definitions: list[Definition], approvals: Mapping[str, str]) -> list[Definition]:
    for name, value in approvals.items():
        if value not in APPROVALS:
            raise ValueError(f"approval for {name!r} is {value!r}; expected one of {sorted(APPROVALS)}")
    # Names not (or no longer) offered are ignored: an override may outlive
    # the tool, or name one whose MCP server is down right now.
    return [
        dataclasses.replace(d, approval=cast(Approval, approvals[d.name])) if d.name in approvals else d
        for d in definitions
    ]


# -- per-profile cache ------------------------------------------------------

_cache: dict[Any, dict[str, Registry]] = {}
REGISTRIES_PER_PROFILE = 4
_cache_lock = threading.Lock()
# One build at a time per profile, so concurrent first steps do not each
# list the same MCP servers; different profiles build in parallel.
_build_locks: dict[Any, threading.Lock] = {}


def config_hash(profile: AgentProfile) -> str:
    config = {"builtin": profile.builtin_tools, "mcp": profile.mcp_servers, "approvals": profile.approvals}
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def unlisted_now(profile: AgentProfile, name: str) -> str | None:
    """For `mcp.<server>.<tool>`, the profile's server asked again now (not
    this process's cached listing): None when it still lists the tool, else
    why not ("unavailable: ..." or "unlisted"). For any other name, None.
    A call owed from an earlier drive is checked this way before it runs, so
    a server upgraded in place that dropped the tool blocks the turn instead
    of answering the model "unknown tool" (runtime/definitions.py)."""
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "mcp":
        return None
    raw = next((r for r in profile.mcp_servers or [] if isinstance(r, dict) and r.get("name") == parts[1]), None)
    if raw is None:
        return None  # not the definition's server: the registry's own check names it
    # Imported here, like build_registry: only a turn owing an MCP call pays the SDK's import.
    from . import mcp

    try:
        listed = mcp.relist_tools(raw)
    except mcp.MCPUnavailable as exc:
        return f"unavailable: {exc}"
    return None if parts[2] in listed else "unlisted"


def registry_for_profile(profile: AgentProfile) -> Registry:
    digest = config_hash(profile)
    cached = _cached(profile.pk, digest)
    if cached is not None:
        return cached
    with _cache_lock:
        build_lock = _build_locks.setdefault(profile.pk, threading.Lock())
    with build_lock:
        cached = _cached(profile.pk, digest)
        if cached is not None:
            return cached
        registry = build_registry(
            profile.builtin_tools or [], profile.mcp_servers or [], profile.approvals or {}, strict=False
        )
        if registry.degraded:
            return registry  # not cached: the next step tries the missing servers again
        with _cache_lock:
            # A few entries per profile: turns of an older agent version run
            # beside the newest one's (runtime/versions.py) without rebuilding
            # each other's registries; the oldest entry makes way.
            entries = _cache.setdefault(profile.pk, {})
            entries.pop(digest, None)
            entries[digest] = registry
            while len(entries) > REGISTRIES_PER_PROFILE:
                entries.pop(next(iter(entries)))
        return registry


def _cached(pk: Any, digest: str) -> Registry | None:
    with _cache_lock:
        entries = _cache.get(pk)
        return entries.get(digest) if entries is not None else None


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


# -- checking a configuration ------------------------------------------------


def builtin_name_problems(names: Any) -> list[str]:
    """What is wrong with a profile's built-in tool names (none: []): each name
    must be a string this registry's built-ins know, named once."""
    if not isinstance(names, list):
        return ["must be a list of built-in tool names"]
    problems = []
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or name not in BUILTINS:
            problems.append(f"unknown built-in tool {name!r}; known built-ins: {', '.join(sorted(BUILTINS))}")
        elif name in seen:
            problems.append(f"{name!r} is listed twice")
        else:
            seen.add(name)
    return problems


def is_builtin(name: str) -> bool:
    return name in BUILTINS
