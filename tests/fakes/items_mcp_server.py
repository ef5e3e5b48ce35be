"""A stdio MCP server whose tool lists items with a continuation, for the
monitors' `mcp` source. Run as `python -m tests.fakes.items_mcp_server` with
ITEMS_FILE naming a JSON file: a list of {"id", "title", "updated_at"},
newest first, read at every call (a test adds items by rewriting it).
`list_items(cursor)` answers `{"items": [...two...], "next": cursor | null}`;
a file named ITEMS_FILE + ".fail" makes the next call an error (and is
removed), as a source that cannot be read."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("items", version="1.0", log_level="WARNING", subscriptions=False)
PAGE = 2


@server.tool(description="List items, newest first, two a page; pass the answer's `next` as `cursor`.")
def list_items(cursor: str = "") -> str:
    # Sync: small local files, read at every call (the SDK runs a sync tool off its event loop).
    path = Path(os.environ["ITEMS_FILE"])
    fail = Path(str(path) + ".fail")
    if fail.exists():
        fail.unlink()
        raise ToolError("the upstream answered 429")
    rows = json.loads(path.read_text()) if path.exists() else []
    start = int(cursor or 0)
    more = len(rows) > start + PAGE
    return json.dumps({"items": rows[start : start + PAGE], "next": str(start + PAGE) if more else None})


_ROOT = Path(__file__).resolve().parents[2]


def items_server(items_file: Path) -> dict[str, Any]:
    """A profile's `mcp_servers` entry (named items) for this server."""
    env = {"ITEMS_FILE": str(items_file), "PYTHONPATH": str(_ROOT)}
    return {"name": "items", "command": sys.executable, "args": ["-m", "tests.fakes.items_mcp_server"], "env": env}


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    server.run("stdio")
