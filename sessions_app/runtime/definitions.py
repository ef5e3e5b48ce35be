"""Missing definitions: what a turn needs that the running code or the
definition the turn runs under no longer provides.

A deploy or an edit can take away a built-in tool, an MCP server (it fails
to start, or no longer lists a tool), a summarizer or a model role while a
turn still needs it. The turn is then blocked (turn/blocked, code
`definition_missing`, `what` naming it) and stays live: nothing is dropped,
no attempt of unknown outcome is orphaned (it stays in the ledger, in front
of an operator), and the model is never told "unknown tool" about a call it
made while the tool existed. Restoring the definition and a Retry, or an
operator's Abandon, moves it on.

Which calls count as made under an older definition: every call the turn
still owes from an earlier drive (a parked approval, an attempt in flight at
a crash, a call queued behind one of those). A call the model makes now, to
a name its current tool list does not have, is the model's mistake and gets
the ordinary error result (calls.py tells the two apart).

`what` is "<kind>:<name>": `tool:<tool name>`, `mcp_server:<server name>`,
`summarizer:<name>`, `role:<role>`.

Each check takes the definition the turn runs under (today the session's
profile), so it holds unchanged when that comes from a pinned version.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions_app.models import AgentProfile
from sessions_app.tools.registry import Registry


@dataclass(frozen=True)
class Missing:
    """What is missing (`what`, "<kind>:<name>") and why, for turn/blocked."""

    what: str
    reason: str


def missing_tool(name: str, definition: AgentProfile, registry: Registry, now: str | None = None) -> Missing:
    """Why the tool `name`, which a call the turn owes was made to, is not in
    `registry` (built for `definition`), or not on its server when asked
    again (`now`, tools.registry.unlisted_now): its MCP server is down, the
    server no longer lists it, the running code lacks the built-in, or the
    definition no longer has it."""
    if name.startswith("mcp."):
        server = name.split(".")[1] if name.count(".") >= 2 else ""
        down = registry.unavailable.get(server)
        if down is None and now is not None and now.startswith("unavailable: "):
            down = now.removeprefix("unavailable: ")
        if down is not None:
            return Missing(
                f"mcp_server:{server}", f"MCP server {server!r}, which {name!r} is owed to, is unavailable: {down}"
            )
        if server in _server_names(definition):
            return Missing(f"tool:{name}", f"MCP server {server!r} no longer lists {name!r}, which a call is owed to")
        return Missing(
            f"tool:{name}", f"the agent's definition no longer has MCP server {server!r}, which {name!r} is on"
        )
    if name in registry.absent:
        return Missing(f"tool:{name}", f"the running code has no built-in tool {name!r}, which a call is owed to")
    return Missing(f"tool:{name}", f"the agent's definition no longer offers {name!r}, which a call is owed to")


def missing_builtin(registry: Registry) -> Missing | None:
    """A built-in tool the definition names that the running code lacks: a
    step would offer the model a tool set the definition does not say."""
    if not registry.absent:
        return None
    name = registry.absent[0]
    return Missing(
        f"tool:{name}", f"the agent's definition names the built-in tool {name!r}, which the running code lacks"
    )


def _server_names(definition: AgentProfile) -> set[str]:
    return {str(raw.get("name")) for raw in definition.mcp_servers or [] if isinstance(raw, dict)}
