"""A stdio MCP server that records every execution, for the effect-ledger tests.

Run it as `python -m tests.fakes.effects_mcp_server` with EFFECTS_LOG set to
a file: each tool execution appends one JSON line to it, with the idempotency
key, attempt and fence the client sent in the request's `_meta` (None when it
sent none). Counting lines is how a test counts executions at the target.

Its tools differ only in their annotations (mcp 2.x `MCPServer` API):
`lookup` is read-only, `upsert` idempotent, `destroy` destructive (and
idempotent), `mutate` has no annotations at all.

Two switches make it another release of itself: EFFECTS_HIDE (tool names,
comma-separated) leaves those tools out of its listing and its calls, and
EFFECTS_FAIL_START=1 makes it exit before the handshake (a server that
fails to start). A third changes it while it runs, as a server upgraded in
place does: EFFECTS_HIDE_FILE names a file read at every request, whose
comma-separated tool names are left out of the listing and answered as
unknown tools (`hide_now`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

KEY, ATTEMPT, FENCE = "io.terret/idempotency_key", "io.terret/attempt", "io.terret/fence"


def _hidden_now() -> set[str]:
    path = os.environ.get("EFFECTS_HIDE_FILE")
    if not path or not os.path.exists(path):
        return set()
    return {name.strip() for name in Path(path).read_text().split(",") if name.strip()}


class _Effects(MCPServer):
    """Reads EFFECTS_HIDE_FILE at every listing and call (see the docstring)."""

    async def list_tools(self) -> Any:
        hidden = _hidden_now()
        return [tool for tool in await super().list_tools() if tool.name not in hidden]

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if name in _hidden_now():
            raise ToolError(f"Unknown tool: {name}")
        return await super().call_tool(name, arguments, context)


server = _Effects("effects", version="1.0", log_level="WARNING", subscriptions=False)

Seconds = Annotated[float, Field(ge=0, le=30)]


def _record(tool: str, label: str, ctx: Context) -> None:
    meta: Any = ctx.request_context.meta or {}
    line = {
        "tool": tool,
        "label": label,
        "key": meta.get(KEY),
        "attempt": meta.get(ATTEMPT),
        "fence": meta.get(FENCE),
        "pid": os.getpid(),
    }
    fd = os.open(os.environ["EFFECTS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def _run(tool: str, done: str, ctx: Context, seconds_before: float, seconds_after: float, label: str) -> str:
    await anyio.sleep(seconds_before)
    _record(tool, label, ctx)
    await anyio.sleep(seconds_after)
    return f"{done}{f' {label}' if label else ''}"


@server.tool(
    description="Look something up (changes nothing).",
    annotations=ToolAnnotations(read_only_hint=True),
)
async def lookup(ctx: Context, seconds_before: Seconds = 0, seconds_after: Seconds = 0, label: str = "") -> str:
    return await _run("lookup", "looked up", ctx, seconds_before, seconds_after, label)


@server.tool(
    description="Insert or update a record (running it twice is running it once).",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
)
async def upsert(ctx: Context, seconds_before: Seconds = 0, seconds_after: Seconds = 0, label: str = "") -> str:
    return await _run("upsert", "upserted", ctx, seconds_before, seconds_after, label)


@server.tool(description="Change something (no annotations at all).")
async def mutate(ctx: Context, seconds_before: Seconds = 0, seconds_after: Seconds = 0, label: str = "") -> str:
    return await _run("mutate", "mutated", ctx, seconds_before, seconds_after, label)


@server.tool(
    description="Destroy a record (destructive, though idempotent).",
    annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True),
)
async def destroy(ctx: Context, seconds_before: Seconds = 0, seconds_after: Seconds = 0, label: str = "") -> str:
    return await _run("destroy", "destroyed", ctx, seconds_before, seconds_after, label)


# -- the client side: how a test runs this server and reads what it did -----

_ROOT = Path(__file__).resolve().parents[2]


def fx_server(
    effects_log: Path, *, hide: tuple[str, ...] = (), fail_start: bool = False, hide_file: Path | None = None
) -> dict[str, Any]:
    """A profile's `mcp_servers` entry (named fx) for this server; `hide`,
    `fail_start` and `hide_file` set the switches above."""
    # The SDK starts servers with a minimal environment (no PYTHONPATH) in
    # the worker's cwd; PYTHONPATH makes `-m tests.fakes...` work from anywhere.
    env = {"EFFECTS_LOG": str(effects_log), "PYTHONPATH": str(_ROOT)}
    if hide:
        env["EFFECTS_HIDE"] = ",".join(hide)
    if fail_start:
        env["EFFECTS_FAIL_START"] = "1"
    if hide_file is not None:
        env["EFFECTS_HIDE_FILE"] = str(hide_file)
    return {"name": "fx", "command": sys.executable, "args": ["-m", "tests.fakes.effects_mcp_server"], "env": env}


def hide_now(hide_file: Path, *names: str) -> None:
    """The running server lists (and runs) none of `names` from its next request on; none: all again."""
    hide_file.write_text(",".join(names))


def executions(effects_log: Path) -> list[dict[str, Any]]:
    """One entry per execution, as the server recorded it."""
    if not effects_log.exists():
        return []
    return [json.loads(line) for line in effects_log.read_text().splitlines()]


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    if os.environ.get("EFFECTS_FAIL_START") == "1":
        sys.exit("effects server: told to fail at start (EFFECTS_FAIL_START=1)")
    for hidden in filter(None, os.environ.get("EFFECTS_HIDE", "").split(",")):
        server.remove_tool(hidden)
    server.run("stdio")
