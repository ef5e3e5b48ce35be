"""The `mcp` source: a tool of one of the session's MCP servers (its
profile's `mcp_servers`) that answers a page of items as JSON text, with a
continuation. Fields are named by dotted paths as for `http_json`; the
continuation goes back as the `cursor_arg` argument until the answer's
`next_cursor` is empty, and that end is the boundary proven (the tool's
list is taken as exhaustive). A tool error, a server that does not start or
an answer that is not JSON: `failed` if no page was read, `partial`
otherwise. The server is found by name at every scan, through the session's
current profile: a server that is gone fails the scan, naming it."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from sessions_app.errors import InvalidInput
from sessions_app.models import Session
from sessions_app.monitors.sources.base import Item, Scan
from sessions_app.monitors.sources.feed import DEFAULT_OVERLAP, INITIALS, MAX_PAGES, gap
from sessions_app.monitors.sources.http_json import PATH_CHARS, HttpJson, dig
from sessions_app.tools.base import ToolError

SESSION_KEY = "_session_id"  # set by run.py at scan time, never stored


class Mcp:
    name = "mcp"
    version = 1

    def check(self, config: dict[str, Any]) -> dict[str, Any]:
        server, tool = config.get("server"), config.get("tool")
        if not isinstance(server, str) or not server or not isinstance(tool, str) or not tool:
            raise InvalidInput("an mcp source names a server (of the session's profile) and its tool")
        arguments = config.get("arguments", {})
        if not isinstance(arguments, dict) or len(json.dumps(arguments)) > 4000:
            raise InvalidInput("arguments must be an object of at most 4000 characters as JSON")
        out: dict[str, Any] = {"kind": "mcp", "server": server[:64], "tool": tool[:200], "arguments": arguments}
        defaults = {"items": "items", "id": "id", "title": "title", "link": "url", "time": "updated_at"}
        for name in ("items", "id", "version", "title", "link", "time", "cursor_arg", "next_cursor"):
            value = config.get(name, defaults.get(name, ""))
            if not isinstance(value, str) or len(value) > PATH_CHARS:
                raise InvalidInput(f"{name} must be a dotted path of at most {PATH_CHARS} characters")
            out[name] = value
        if bool(out["cursor_arg"]) != bool(out["next_cursor"]):
            raise InvalidInput("cursor_arg and next_cursor go together")
        initial = config.get("initial", "all")
        if initial not in INITIALS:
            raise InvalidInput(f"initial must be one of {', '.join(INITIALS)}")
        overlap = config.get("overlap_seconds", DEFAULT_OVERLAP)
        if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap <= 30 * 86400:
            raise InvalidInput("overlap_seconds must be an integer from 0 to 2592000")
        partition = config.get("partition") or "default"
        if not isinstance(partition, str) or len(partition) > 120:
            raise InvalidInput("a partition is a name of at most 120 characters")
        out.update(
            {
                "partition": partition,
                "name": str(config.get("name") or f"mcp:{server}/{tool}")[:300],
                "initial": initial,
                "overlap_seconds": overlap,
            }
        )
        return out

    def revision(self, config: dict[str, Any]) -> str:
        query = json.dumps({k: config.get(k) for k in ("server", "tool", "arguments", "items", "id")}, sort_keys=True)
        return hashlib.sha256(f"mcp\n{query}".encode()).hexdigest()[:32]

    def scan(self, config: dict[str, Any], checkpoint: datetime | None, initialized: bool) -> Scan:
        session = Session.objects.select_related("profile").filter(id=str(config.get(SESSION_KEY, ""))).first()
        servers = list(session.profile.mcp_servers) if session and session.profile else []
        server = next((s for s in servers if isinstance(s, dict) and s.get("name") == config["server"]), None)
        if server is None:
            return gap({}, 0, [], f"definition_missing: the session's profile has no MCP server {config['server']!r}")
        overlap = timedelta(seconds=int(config.get("overlap_seconds", DEFAULT_OVERLAP)))
        floor = checkpoint - overlap if checkpoint is not None else None
        items: dict[tuple[str, str], Item] = {}
        newest, pages = checkpoint, 0
        visited: list[str] = []
        cursor: str | None = None
        while True:
            if pages >= MAX_PAGES:
                return gap(items, pages, visited, f"stopped after {MAX_PAGES} pages before the list ended")
            args = {**config["arguments"], **({config["cursor_arg"]: cursor} if cursor else {})}
            where = f"{config['server']}/{config['tool']} cursor {cursor or '-'}"
            try:
                from sessions_app.tools import mcp  # local: the MCP SDK loads only when a monitor reads an MCP source

                body = json.loads(str(mcp.call_tool(server, config["tool"], args)))
            except ToolError as exc:
                return gap(items, pages, visited, f"page {pages + 1} ({where}): {exc}")
            except ValueError as exc:
                return gap(items, pages, visited, f"page {pages + 1} ({where}) is not JSON: {exc}")
            rows = dig(body, config["items"])
            if not isinstance(rows, list):
                return gap(items, pages, visited, f"page {pages + 1} ({where}) has no list at {config['items']!r}")
            pages += 1
            visited.append(where)
            for row in rows:
                item = HttpJson._item(config, row)
                if item is None:
                    continue
                if item.time is not None:
                    newest = item.time if newest is None or item.time > newest else newest
                    if floor is not None and item.time < floor:
                        continue
                items.setdefault((item.id, item.version), item)
            nxt = dig(body, config["next_cursor"]) if config.get("next_cursor") else None
            if nxt in (None, "") or not isinstance(nxt, (str, int)):
                break
            if str(nxt) == cursor:
                return gap(items, pages, visited, f"the continuation repeats ({nxt!r})")
            cursor = str(nxt)
        return Scan(
            coverage="complete",
            items=list(items.values()),
            pages=pages,
            boundary=checkpoint,
            checkpoint=newest,
            evidence={"pages": visited, "boundary": "the tool's list ended"},
        )
