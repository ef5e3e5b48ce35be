"""Fixtures of the service tests, defined once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class MorphHandler(BaseHTTPRequestHandler):
    """Morph's Compact API on loopback: answers by the server's `mode` and
    records every request (path, headers, body) in `requests`."""

    protocol_version = "HTTP/1.1"
    server: MorphServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body})
        mode = self.server.mode
        if mode == "ok":
            self._send(200, json.dumps(self.server.payload).encode())
        elif mode == "http_error":
            self._send(503, b'{"error": {"message": "overloaded"}}')
        elif mode == "auth_error":
            self._send(401, b'{"error": "bad key"}')
        elif mode == "torn":
            # Promise more than is sent, then hang up mid-body.
            data = json.dumps(self.server.payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
        elif mode == "not_json":
            self._send(200, b'{"output": "half a JSON docu')
        elif mode == "no_output":
            self._send(200, b'{"id": "c1", "model": "morph-compactor", "usage": {"input_tokens": 5}}')
        else:
            raise AssertionError(mode)

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class MorphServer(ThreadingHTTPServer):
    daemon_threads = True
    mode = "ok"
    payload: dict[str, Any] = {}
    requests: list[dict[str, Any]]


@pytest.fixture
def morph(settings: Any) -> Iterator[MorphServer]:
    server = MorphServer(("127.0.0.1", 0), MorphHandler)
    server.requests = []
    server.payload = {
        "id": "cmp-1",
        "model": "morph-compactor",
        "output": "[user] keep this line\n(filtered 3 lines)",
        "usage": {"input_tokens": 120, "output_tokens": 30, "compression_ratio": 0.25, "processing_time_ms": 40},
    }
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    settings.MORPH_BASE_URL = f"http://127.0.0.1:{server.server_address[1]}/v1"
    settings.MORPH_API_KEY = "morph-test-key"
    yield server
    server.shutdown()
    server.server_close()
