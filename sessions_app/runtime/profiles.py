"""What makes an agent profile usable: the checks the admin runs on save,
and that the runtime can run on a profile before it spawns an agent.

`check_profile` returns every problem at once, by field, in words meant for
the person editing the profile: {"roles": [...], "approvals": [...]}; an
empty dict means the profile is fine. It starts no MCP server: a server's
tools are known only once it runs, so an approval override for an MCP tool
is checked only for naming one of the profile's servers.
"""

from __future__ import annotations

from typing import Any, get_args

from django.contrib.auth.models import Group

from sessions_app.log.catalogue import MODEL_ROLES, ON_EXPIRY
from sessions_app.tools.base import Approval
from sessions_app.tools.registry import builtin_name_problems, is_builtin

APPROVAL_MODES: tuple[str, ...] = get_args(Approval)  # never, policy, always (approvals_app/gate.py)
MCP_KEYS = ("name", "command", "args", "env", "url", "headers", "timeout", "workspace")


def check_profile(
    *,
    roles: Any,
    builtin_tools: Any,
    mcp_servers: Any,
    approvals: Any,
    context_windows: Any = None,
    image_roles: Any = None,
    command_allow: Any = None,
) -> dict[str, list[str]]:
    """Problems by field name (roles, builtin_tools, mcp_servers, approvals, context_windows, image_roles)."""
    problems = {
        "roles": _roles(roles),
        "builtin_tools": builtin_name_problems(builtin_tools),
        "mcp_servers": _mcp_servers(mcp_servers),
        "approvals": _approvals(approvals, builtin_tools, mcp_servers),
        "context_windows": _windows({} if context_windows is None else context_windows),
        "image_roles": _image_roles([] if image_roles is None else image_roles),
        "command_allow": _command_allow([] if command_allow is None else command_allow),
    }
    return {field: found for field, found in problems.items() if found}


def _command_allow(patterns: Any) -> list[str]:
    """A list of non-empty glob patterns, each matched against a command task's argv[0]."""
    if not isinstance(patterns, list) or not all(
        isinstance(p, str) and p.strip() and "\x00" not in p for p in patterns
    ):
        return ['command_allow must be a list of glob patterns (non-empty strings), e.g. ["sh", "make"]']
    return []


def _roles(roles: Any) -> list[str]:
    if not isinstance(roles, dict):
        return ['must be an object mapping a model role to a model spec, e.g. {"main": "openai/gpt-4o-mini"}']
    problems = []
    for role, spec in roles.items():
        if role not in MODEL_ROLES:
            problems.append(f"unknown model role {role!r}; the roles are {', '.join(MODEL_ROLES)}")
        elif not isinstance(spec, str) or not spec.strip():
            problems.append(
                f"the {role} role needs a model spec (a non-empty string); leave the role out for the default"
            )
    return problems


MIN_WINDOW_TOKENS = 1024


def _windows(windows: Any) -> list[str]:
    if not isinstance(windows, dict):
        return ['must be an object mapping a model role to its context window in tokens, e.g. {"main": 128000}']
    problems = []
    for role, tokens in windows.items():
        if role not in MODEL_ROLES:
            problems.append(f"unknown model role {role!r}; the roles are {', '.join(MODEL_ROLES)}")
        elif isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < MIN_WINDOW_TOKENS:
            problems.append(f"the {role} role's window must be a whole number of tokens, at least {MIN_WINDOW_TOKENS}")
    return problems


def _image_roles(roles: Any) -> list[str]:
    if not isinstance(roles, list):
        return ['must be a list of the model roles whose model accepts images, e.g. ["main"]']
    return [
        f"unknown model role {role!r}; the roles are {', '.join(MODEL_ROLES)}"
        for role in roles
        if role not in MODEL_ROLES
    ]


def accepts_images(profile: Any, role: str) -> bool:
    """Whether `role`'s model takes images (the profile's image_roles): a
    tool's images then reach it as image parts, else as a text description."""
    return role in (getattr(profile, "image_roles", None) or [])


def _mcp_servers(servers: Any) -> list[str]:
    if not isinstance(servers, list):
        return ['must be a list of servers, e.g. [{"name": "time", "command": "uvx", "args": ["mcp-server-time"]}]']
    # Imported here: tools.mcp loads the MCP SDK (about half a second), which
    # a process whose profiles name no MCP server should never pay.
    from sessions_app.tools.mcp import ServerConfig

    problems = []
    seen: set[str] = set()
    for n, raw in enumerate(servers, start=1):
        if not isinstance(raw, dict):
            problems.append(f"server {n}: must be an object with a name and a command")
            continue
        label = f"server {raw['name']!r}" if isinstance(raw.get("name"), str) and raw["name"] else f"server {n}"
        unknown = sorted(str(k) for k in raw if k not in MCP_KEYS)
        if unknown:
            problems.append(f"{label}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(MCP_KEYS)}")
        try:
            config = ServerConfig.parse(raw)
        except ValueError as exc:
            problems.append(f"{label}: {exc}" if not str(exc).startswith("MCP server") else str(exc))
            continue
        if config.name in seen:
            problems.append(f"two MCP servers are named {config.name!r}")
        seen.add(config.name)
    return problems


def _server_names(servers: Any) -> set[str]:
    if not isinstance(servers, list):
        return set()
    return {s["name"] for s in servers if isinstance(s, dict) and isinstance(s.get("name"), str)}


def _approvals(approvals: Any, builtin_tools: Any, mcp_servers: Any) -> list[str]:
    if not isinstance(approvals, dict):
        return [
            "must be an object mapping a tool name to never, policy or always, or to the tool's own approval "
            'settings, e.g. {"workspace.write": "always", "shell.run": {"mode": "always", "approval_deadline_s": 600}}'
        ]
    enabled = set(builtin_tools) if isinstance(builtin_tools, list) else set()
    servers = _server_names(mcp_servers)
    modes = ", ".join(APPROVAL_MODES)
    problems = []
    for name, mode in approvals.items():
        if isinstance(mode, dict):
            problems += _tool_approval(name, mode)
        elif mode not in APPROVAL_MODES:
            problems.append(f"{name}: {mode!r} is not an approval mode; use one of {modes}")
        if name.startswith("mcp."):
            parts = name.split(".", 2)
            if len(parts) < 3 or parts[1] not in servers or not parts[2]:
                problems.append(f"{name}: names no tool of this profile's MCP servers (mcp.<server>.<tool>)")
        elif not is_builtin(name):
            problems.append(f"{name}: no such tool; use a built-in tool's name or mcp.<server>.<tool>")
        elif name not in enabled:
            problems.append(f"{name}: this profile does not enable that built-in (add it to builtin tools)")
    return problems


TOOL_APPROVAL_KEYS = ("mode", "approval_deadline_s", "remind_every_s", "escalate_to", "on_expiry")


def _tool_approval(name: str, settings: dict[str, Any]) -> list[str]:
    """A tool's own approval settings: its mode and its deadline settings,
    each overriding the profile's (approvals_app/gate.py deadline_for)."""
    problems = []
    unknown = sorted(str(k) for k in settings if k not in TOOL_APPROVAL_KEYS)
    if unknown:
        problems.append(f"{name}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(TOOL_APPROVAL_KEYS)}")
    if "mode" in settings and settings["mode"] not in APPROVAL_MODES:
        problems.append(f"{name}: {settings['mode']!r} is not an approval mode; use one of {', '.join(APPROVAL_MODES)}")
    for key in ("approval_deadline_s", "remind_every_s"):
        value = settings.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"{name}: {key} must be a whole number of seconds, at least 1 (or null: none)")
    if settings.get("on_expiry", "deny") not in ON_EXPIRY:
        problems.append(f"{name}: on_expiry must be deny or park")
    group = settings.get("escalate_to")
    if group is not None and (not isinstance(group, str) or not Group.objects.filter(name=group).exists()):
        problems.append(f"{name}: escalate_to must name a group (or be null)")
    return problems
