"""A small stdio MCP server for tests, built on the mcp 2.x `MCPServer` API.

Run it as `python tests/fakes/slow_mcp_server.py`. Its tools are async so that
concurrent calls overlap inside the one server process, which is what the
client's concurrency tests need to observe.
"""

from __future__ import annotations

import logging
import os

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False)

server = MCPServer("slow", version="1.0", log_level="WARNING", subscriptions=False)
_notes: list[str] = []


@server.tool(description="Return the text unchanged.", annotations=READ_ONLY)
async def echo(text: str) -> str:
    return text


@server.tool(description="Sleep for the given seconds, then say so.", annotations=READ_ONLY)
async def slow(seconds: float) -> str:
    await anyio.sleep(seconds)
    return f"done after {seconds:g}s"


@server.tool(description="Always fail with an error result.")
async def fail() -> str:
    raise ToolError("this tool always fails")


@server.tool(description="The server's process id (lets tests kill it).", annotations=READ_ONLY)
async def pid() -> str:
    return str(os.getpid())


@server.tool(description="Append a note; destructive by annotation.", annotations=DESTRUCTIVE)
async def add_note(text: str) -> str:
    _notes.append(text)
    return f"{len(_notes)} notes"


@server.tool(description="Return a large text of the given size in characters.")
async def big(size: int) -> str:
    return "x" * size


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    server.run("stdio")
