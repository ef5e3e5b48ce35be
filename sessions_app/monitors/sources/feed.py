"""The `feed` source: RSS or Atom over HTTP, parsed by feedparser.

Ordering: a feed lists its newest items first and pages back in time by
RFC 5005 links (`next`, or `prev-archive` for an archived feed). An item's
identity is its id (guid), else its link; its version is its updated (else
published) time, else a hash of its content: an updated item is a new
version, delivered again.

A scan reads pages from the newest until it has seen an item at or before
the checkpoint minus the overlap window (the overlap is rescanned and
deduplicated by identity and version, so late arrivals and ties inside it
are caught). It is `complete` only when it saw an item at or before the
checkpoint itself, or it is the first run (the whole feed read to its end).
A feed whose pages end before the checkpoint (expired history), a 429, an
authentication failure, a truncated or unreadable page: `failed` if no page
was read, `partial` otherwise, and the checkpoint stays where it was.
"""

from __future__ import annotations

import calendar
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urljoin

import httpx

from sessions_app import outbound
from sessions_app.errors import InvalidInput, UnsafeUrl
from sessions_app.monitors.sources.base import Item, Scan

MAX_PAGES = 50
MAX_PAGE_BYTES = 2 * 1024 * 1024
TIMEOUT = 10.0
DEFAULT_OVERLAP = 3600
INITIALS = ("all", "now")


class Feed:
    name = "feed"
    version = 1

    def check(self, config: dict[str, Any]) -> dict[str, Any]:
        url = config.get("url")
        if not isinstance(url, str):
            raise InvalidInput("a feed source needs a url")
        outbound.check_url(url)
        partition = config.get("partition") or "default"
        if not isinstance(partition, str) or len(partition) > 120:
            raise InvalidInput("a partition is a name of at most 120 characters")
        initial = config.get("initial", "all")
        if initial not in INITIALS:
            raise InvalidInput(f"initial must be one of {', '.join(INITIALS)}")
        overlap = config.get("overlap_seconds", DEFAULT_OVERLAP)
        if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap <= 30 * 86400:
            raise InvalidInput("overlap_seconds must be an integer from 0 to 2592000")
        name = config.get("name") or url
        return {
            "kind": "feed",
            "url": url.strip(),
            "partition": partition,
            "name": str(name)[:300],
            "initial": initial,
            "overlap_seconds": overlap,
        }

    def revision(self, config: dict[str, Any]) -> str:
        return hashlib.sha256(f"feed\n{config['url']}".encode()).hexdigest()[:32]

    def scan(self, config: dict[str, Any], checkpoint: datetime | None, initialized: bool) -> Scan:
        overlap = timedelta(seconds=int(config.get("overlap_seconds", DEFAULT_OVERLAP)))
        floor = checkpoint - overlap if checkpoint is not None else None
        first = not initialized
        items: dict[tuple[str, str], Item] = {}
        newest: datetime | None = checkpoint
        proven = False
        url: str | None = config["url"]
        import feedparser  # on the first scan, not in every worker's boot (terret_site/worker.py)

        pages = 0
        visited: list[str] = []
        while url is not None:
            if url in visited:
                return gap(items, pages, visited, f"the feed's paging loops back to {url}")
            if pages >= MAX_PAGES:
                return gap(items, pages, visited, f"stopped after {MAX_PAGES} pages before reaching the checkpoint")
            try:
                body = get_page(url)
            except PageError as exc:
                return gap(items, pages, visited, f"page {pages + 1} ({url}): {exc}")
            parsed = feedparser.parse(body)
            if parsed.get("bozo") and not isinstance(
                parsed.get("bozo_exception"), feedparser.CharacterEncodingOverride
            ):
                reason = parsed.get("bozo_exception")
                return gap(items, pages, visited, f"page {pages + 1} ({url}) is unreadable or truncated: {reason}")
            pages += 1
            visited.append(url)
            past_floor = False
            for entry in parsed.entries:
                item = _item(entry)
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
            if past_floor:
                break
            url = _next(parsed, url)
        if not (proven or first or checkpoint is None):
            return gap(
                items,
                pages,
                visited,
                f"history expired: the feed ends after {pages} page(s) without reaching the checkpoint "
                f"{checkpoint.isoformat()}; items between may be lost",
            )
        return Scan(
            coverage="complete",
            items=list(items.values()),
            pages=pages,
            boundary=checkpoint,
            checkpoint=newest,
            evidence={"pages": visited, "boundary": "first run: the whole feed" if first else "checkpoint seen"},
        )


class PageError(Exception):
    """A page that could not be read: its reason becomes the scan's error."""


def gap(items: dict[tuple[str, str], Item], pages: int, visited: list[str], error: str) -> Scan:
    return Scan(
        coverage="partial" if pages else "failed",
        items=list(items.values()),
        pages=pages,
        error=error,
        evidence={"pages": visited},
    )


def get_page(url: str, accept: str = "application/atom+xml, application/rss+xml") -> bytes:
    """One page through the SSRF check; PageError for anything but a 200 of at most MAX_PAGE_BYTES."""
    try:
        response = outbound.request("GET", url, content=b"", headers={"Accept": accept}, timeout=TIMEOUT)
    except UnsafeUrl as exc:
        raise PageError(f"refused: {exc}") from None
    except httpx.HTTPError as exc:
        raise PageError(f"{type(exc).__name__}: {exc or 'the connection failed'} (truncated or unreachable)") from None
    status = response.status_code
    if status == 429:
        raise PageError(f"HTTP 429 rate limited (Retry-After: {response.headers.get('retry-after', '-')})")
    if status in (401, 403):
        raise PageError(f"HTTP {status}: authentication failed")
    if status in (404, 410):
        raise PageError(f"HTTP {status}: the page is gone (expired history)")
    if status != 200:
        raise PageError(f"HTTP {status}")
    body = response.content
    if len(body) > MAX_PAGE_BYTES:
        raise PageError(f"the page is larger than {MAX_PAGE_BYTES} bytes")
    return body


def _time(entry: Any) -> datetime | None:
    parsed = entry.get("updated_parsed") or entry.get("published_parsed")
    if not parsed:
        return None
    return datetime.fromtimestamp(calendar.timegm(parsed), tz=UTC)


def _item(entry: Any) -> Item | None:
    ident = entry.get("id") or entry.get("link")
    if not ident:
        return None
    when = _time(entry)
    title = str(entry.get("title", ""))[:1000]
    if when is not None:
        version = when.isoformat()
    else:
        version = "h:" + hashlib.sha256(f"{title}\n{entry.get('summary', '')}".encode()).hexdigest()[:24]
    return Item(id=str(ident)[:500], version=version, title=title, url=str(entry.get("link", ""))[:2000], time=when)


def _next(parsed: Any, base: str) -> str | None:
    links = parsed.feed.get("links", [])
    for rel in ("next", "prev-archive"):
        for link in links:
            if link.get("rel") == rel and link.get("href"):
                return urljoin(base, link["href"])
    return None
