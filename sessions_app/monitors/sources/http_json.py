"""The `http_json` source: a JSON list endpoint, paged by a cursor, asked
for what changed `since` a time; its fields named by dotted paths
("data.items", "attributes.updated_at"; a number indexes a list).

A scan asks from the checkpoint minus the overlap (the `since` parameter,
when the endpoint takes one), and follows the cursor until the endpoint
gives none: the list it pages through is taken as exhaustive for that
interval, so reaching its end is the boundary proven. Without a `since`
parameter a scan pages until it has seen an item at or before the
checkpoint (the list newest first), or the list ends. An item's identity is
its `id` field; its version the `version` field, else its time, else a hash
of the item. A 429, an authentication failure, a page that is not JSON or
has no list where the `items` path points: `failed` if no page was read,
`partial` otherwise, and the checkpoint stays where it was.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.utils.dateparse import parse_datetime

from sessions_app import outbound
from sessions_app.errors import InvalidInput
from sessions_app.monitors.sources.base import Item, Scan
from sessions_app.monitors.sources.feed import DEFAULT_OVERLAP, INITIALS, MAX_PAGES, PageError, gap, get_page

PATH_CHARS = 200
FIELDS = ("items", "id", "version", "title", "link", "time", "cursor_param", "next_cursor", "since_param")


def dig(value: Any, path: str) -> Any:
    """The value at a dotted path ("" is the value itself); None where it is missing."""
    for part in [p for p in path.split(".") if p]:
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _time(value: Any) -> datetime | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str):
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            return None
        if parsed is not None:
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def with_params(url: str, params: dict[str, str]) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    return urlunsplit(parts._replace(query=urlencode(query + list(params.items()))))


class HttpJson:
    name = "http_json"
    version = 1

    def check(self, config: dict[str, Any]) -> dict[str, Any]:
        url = config.get("url")
        if not isinstance(url, str):
            raise InvalidInput("an http_json source needs a url")
        outbound.check_url(url)
        out: dict[str, Any] = {"kind": "http_json", "url": url.strip()}
        defaults = {"items": "", "id": "id", "title": "title", "link": "url", "time": "updated_at"}
        for name in FIELDS:
            value = config.get(name, defaults.get(name, ""))
            if not isinstance(value, str) or len(value) > PATH_CHARS:
                raise InvalidInput(f"{name} must be a dotted path of at most {PATH_CHARS} characters")
            out[name] = value
        if not out["id"]:
            raise InvalidInput("id names the field that identifies an item")
        if bool(out["cursor_param"]) != bool(out["next_cursor"]):
            raise InvalidInput("cursor_param and next_cursor go together")
        partition = config.get("partition") or "default"
        if not isinstance(partition, str) or len(partition) > 120:
            raise InvalidInput("a partition is a name of at most 120 characters")
        initial = config.get("initial", "all")
        if initial not in INITIALS:
            raise InvalidInput(f"initial must be one of {', '.join(INITIALS)}")
        overlap = config.get("overlap_seconds", DEFAULT_OVERLAP)
        if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap <= 30 * 86400:
            raise InvalidInput("overlap_seconds must be an integer from 0 to 2592000")
        out.update(
            {
                "partition": partition,
                "name": str(config.get("name") or url)[:300],
                "initial": initial,
                "overlap_seconds": overlap,
            }
        )
        return out

    def revision(self, config: dict[str, Any]) -> str:
        query = json.dumps({k: config.get(k) for k in ("url", "items", "id", "since_param")}, sort_keys=True)
        return hashlib.sha256(f"http_json\n{query}".encode()).hexdigest()[:32]

    def scan(self, config: dict[str, Any], checkpoint: datetime | None, initialized: bool) -> Scan:
        overlap = timedelta(seconds=int(config.get("overlap_seconds", DEFAULT_OVERLAP)))
        floor = checkpoint - overlap if checkpoint is not None else None
        first = not initialized
        since = bool(config.get("since_param")) and floor is not None
        params: dict[str, str] = {config["since_param"]: floor.isoformat()} if since and floor else {}
        items: dict[tuple[str, str], Item] = {}
        newest, proven, pages = checkpoint, False, 0
        visited: list[str] = []
        cursor: str | None = None
        while True:
            url = with_params(config["url"], {**params, **({config["cursor_param"]: cursor} if cursor else {})})
            if pages >= MAX_PAGES:
                return gap(items, pages, visited, f"stopped after {MAX_PAGES} pages before the list ended")
            try:
                body = json.loads(get_page(url, "application/json"))
            except PageError as exc:
                return gap(items, pages, visited, f"page {pages + 1} ({url}): {exc}")
            except ValueError as exc:
                return gap(items, pages, visited, f"page {pages + 1} ({url}) is not JSON (truncated?): {exc}")
            rows = dig(body, config["items"])
            if not isinstance(rows, list):
                return gap(items, pages, visited, f"page {pages + 1} ({url}) has no list at {config['items']!r}")
            pages += 1
            visited.append(url)
            past_floor = False
            for row in rows:
                item = self._item(config, row)
                if item is None:
                    continue
                if item.time is not None:
                    newest = item.time if newest is None or item.time > newest else newest
                    if checkpoint is not None and item.time <= checkpoint:
                        proven = True
                    if floor is not None and item.time < floor:
                        past_floor = True
                        continue
                items.setdefault((item.id, item.version), item)
            nxt = dig(body, config["next_cursor"]) if config.get("next_cursor") else None
            if (past_floor and not since) or nxt in (None, "") or not isinstance(nxt, (str, int)):
                break
            if str(nxt) == cursor:
                return gap(items, pages, visited, f"the cursor repeats ({nxt!r})")
            cursor = str(nxt)
        return Scan(
            coverage="complete",
            items=list(items.values()),
            pages=pages,
            boundary=checkpoint,
            checkpoint=newest,
            evidence={
                "pages": visited,
                "boundary": "first run: the whole list"
                if first
                else ("checkpoint seen" if proven else "the list ended (exhaustive since the checkpoint)"),
            },
        )

    @staticmethod
    def _item(config: dict[str, Any], row: Any) -> Item | None:
        ident = dig(row, config["id"])
        if ident is None or isinstance(ident, (dict, list)) or str(ident) == "":
            return None
        when = _time(dig(row, config["time"])) if config.get("time") else None
        raw_version = dig(row, config["version"]) if config.get("version") else None
        if raw_version is not None and not isinstance(raw_version, (dict, list)):
            version = str(raw_version)[:100]
        elif when is not None:
            version = when.isoformat()
        else:
            version = "h:" + hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:24]
        title = dig(row, config["title"]) if config.get("title") else ""
        link = dig(row, config["link"]) if config.get("link") else ""
        return Item(
            id=str(ident)[:500],
            version=version,
            title=str(title or "")[:1000],
            url=str(link or "")[:2000],
            time=when,
        )
