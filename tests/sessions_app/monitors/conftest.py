"""A real local HTTP feed server (Atom, RFC 5005 paging, late arrivals,
updated items, 429s, truncated pages, expired history) and a real HTTP
receiver for editions (honours Idempotency-Key, answers a receipt id, and
can fail before accepting or accept and then drop the connection), each in
this process on a free local port, counting what reaches them. The SMTP
server is the notifications' `mailbox` fixture, reused."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

import pytest

from tests.sessions_app.notify.conftest import mailbox  # noqa: F401 - the one SMTP fixture, reused

BASE = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Entry:
    id: str
    title: str
    updated: datetime


class FeedServer:
    """Serves /feed (newest first, `page_size` a page, `next` links). Faults
    apply to the next requests, one per request: "429", "truncate" (a page
    cut mid-body), "garbage" (an unparsable page), "auth" (401). `expire_after`
    serves only that many pages: the older ones answer 410."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.page_size = 5
        self.faults: list[str] = []
        self.expire_after: int | None = None
        self.requests = 0
        self.since_asked: list[str | None] = []
        self.lock = threading.Lock()
        self.clock = BASE
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.serve(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/feed"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, n: int = 1, *, at: datetime | None = None) -> list[Entry]:
        """n new items, each 10 minutes after the last (or at `at`: a late arrival)."""
        made = []
        with self.lock:
            for _ in range(n):
                if at is None:
                    self.clock += timedelta(minutes=10)
                key = f"item-{len(self.entries) + 1}"
                e = Entry(f"urn:test:{key}", f"Title {key}", at or self.clock)
                self.entries[e.id] = e
                made.append(e)
        return made

    def update(self, entry_id: str) -> Entry:
        """The item is edited: a new updated time, so a new version."""
        with self.lock:
            self.clock += timedelta(minutes=10)
            e = self.entries[entry_id]
            e.updated = self.clock
            e.title += " (updated)"
            return e

    def versions(self) -> set[tuple[str, str]]:
        with self.lock:
            return {(e.id, e.updated.isoformat()) for e in self.entries.values()}

    def serve(self, h: BaseHTTPRequestHandler) -> None:
        if urlsplit(h.path).path == "/items":
            self.serve_json(h)
            return
        page = int(parse_qs(urlsplit(h.path).query).get("page", ["1"])[0])
        with self.lock:
            self.requests += 1
            fault = self.faults.pop(0) if self.faults else None
            ordered = sorted(self.entries.values(), key=lambda e: (e.updated, e.id), reverse=True)
        if fault == "429":
            self._send(h, 429, b"slow down", {"Retry-After": "60"})
            return
        if fault == "auth":
            self._send(h, 401, b"who are you", {})
            return
        if self.expire_after is not None and page > self.expire_after:
            self._send(h, 410, b"gone", {})
            return
        chunk = ordered[(page - 1) * self.page_size : page * self.page_size]
        more = len(ordered) > page * self.page_size
        body = self.atom(chunk, page if more else None).encode()
        if fault == "garbage":
            body = body[: len(body) // 2]
            self._send(h, 200, body, {"Content-Type": "application/atom+xml"})
            return
        if fault == "truncate":
            h.send_response(200)
            h.send_header("Content-Type", "application/atom+xml")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        self._send(h, 200, body, {"Content-Type": "application/atom+xml"})

    def serve_json(self, h: BaseHTTPRequestHandler) -> None:
        """/items: the same entries as a JSON list endpoint, `since` and `cursor` parameters,
        {"data": {"items": [...]}, "next": cursor | null}; the same faults."""
        query = parse_qs(urlsplit(h.path).query)
        since = datetime.fromisoformat(query["since"][0]) if "since" in query else None
        offset = int(query.get("cursor", ["0"])[0])
        with self.lock:
            self.requests += 1
            self.since_asked.append(query.get("since", [None])[0])
            fault = self.faults.pop(0) if self.faults else None
            ordered = sorted(self.entries.values(), key=lambda e: (e.updated, e.id), reverse=True)
        if fault == "429":
            self._send(h, 429, b"{}", {"Retry-After": "60"})
            return
        if fault == "auth":
            self._send(h, 401, b"{}", {})
            return
        rows = [e for e in ordered if since is None or e.updated >= since]
        chunk = rows[offset : offset + self.page_size]
        more = len(rows) > offset + self.page_size
        body = json.dumps(
            {
                "data": {
                    "items": [
                        {"id": e.id, "title": e.title, "updated_at": e.updated.isoformat(), "url": f"https://x/{e.id}"}
                        for e in chunk
                    ]
                },
                "next": str(offset + self.page_size) if more else None,
            }
        ).encode()
        if fault in ("garbage", "truncate"):
            body = body[: len(body) // 2]
        self._send(h, 200, body, {"Content-Type": "application/json"})

    def atom(self, chunk: list[Entry], page: int | None) -> str:
        nxt = f'<link rel="next" href="{self.url}?page={page + 1}"/>' if page else ""
        items = "".join(
            f"<entry><id>{escape(e.id)}</id><title>{escape(e.title)}</title>"
            f"<updated>{e.updated.strftime('%Y-%m-%dT%H:%M:%SZ')}</updated>"
            f'<link href="https://example.org/{escape(e.id[9:])}"/></entry>'
            for e in chunk
        )
        return (
            '<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom">'
            f"<title>test feed</title><id>urn:test:feed</id><updated>{BASE.strftime('%Y-%m-%dT%H:%M:%SZ')}</updated>"
            f"{nxt}{items}</feed>"
        )

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str]) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class EditionReceiver:
    """Takes editions. A key seen before answers its first receipt and is not
    counted again. Modes for the next POSTs, one per request: "fail" (503,
    nothing accepted), "drop" (accepted, then the connection is cut with no
    answer), "no_id" (accepted, 200 with no id)."""

    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> body
    posts: int = 0
    modes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> EditionReceiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                key = self.headers.get("Idempotency-Key", "")
                with outer.lock:
                    outer.posts += 1
                    mode = outer.modes.pop(0) if outer.modes else None
                    if mode == "fail":
                        status, answer = 503, b"{}"
                    else:
                        outer.accepted.setdefault(key, json.loads(body))
                        answer = b"{}" if mode == "no_id" else json.dumps({"id": f"rcpt-{key}"}).encode()
                        status = 200
                if mode == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/editions"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def items(self) -> list[tuple[str, str]]:
        """Every item version the receiver accepted, once per accepted edition."""
        with self.lock:
            return [(i["id"], i["version"]) for body in self.accepted.values() for i in body["items"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def feed_server(settings: Any) -> Iterator[FeedServer]:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["127.0.0.1"]
    server = FeedServer()
    yield server
    server.close()


@pytest.fixture
def edition_receiver(settings: Any) -> Iterator[EditionReceiver]:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["127.0.0.1"]
    server = EditionReceiver().start()
    yield server
    server.close()
