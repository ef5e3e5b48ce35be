"""The client MCP's conformance suite drives: Terret's own MCP client code.

`conformance client --command "python -m tests.sessions_app.tools.conformance_client"`
starts this with the scenario's server URL as its last argument (and the
scenario's name in MCP_CONFORMANCE_SCENARIO). It does what a turn does with a
remote server: list the tools through `sessions_app.tools.mcp` (a Streamable
HTTP ServerConfig, the manager's own loop and connection), then call each
tool through its Definition's handler, with arguments made from the tool's
input schema. It exits 0 unless the client itself failed; the suite judges
the exchange it saw.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from sessions_app.tools import mcp
from sessions_app.tools.base import ToolContext
from sessions_app.tools.executor import execute

SAMPLES = {"number": 2, "integer": 3, "string": "terret", "boolean": True}


def arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """A value of the right type for every property of the schema."""
    props = schema.get("properties") or {}
    return {name: SAMPLES.get(str(spec.get("type")), None) for name, spec in props.items()}


def main(url: str) -> int:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    config = {"name": "conformance", "url": url, "timeout": 20}
    ctx = ToolContext(uuid.uuid4(), "conformance-call", Path("."), idempotency_key=f"terret:{scenario}", attempt=1)
    try:
        for defn in mcp.list_tools(config):
            outcome = execute(defn, ctx, json.dumps(arguments(defn.parameters)))
            print(f"{defn.name}: {'error' if outcome.is_error else 'ok'}: {outcome.content[:200]}")
    finally:
        mcp.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
