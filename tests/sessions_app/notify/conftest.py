"""A real SMTP server (aiosmtpd) and a real HTTP receiver for webhooks, each
in this process on a free local port, counting what reaches them."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller

SECRET = "a-webhook-secret-of-some-length"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Mailbox:
    host: str
    port: int
    messages: list[tuple[list[str], Message]] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
        self.messages.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 OK"

    def to(self, address: str) -> list[Message]:
        return [m for rcpts, m in self.messages if address in rcpts]


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes

    def signed_with(self, secret: str) -> bool:
        expected = "sha256=" + hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers.get("x-terret-signature", ""), expected)

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """Counts every POST; answers each with the next status of `statuses` (then 200)."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.statuses: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.deliveries.append(Delivery({k.lower(): v for k, v in self.headers.items()}, body))
                status = outer.statuses.pop(0) if outer.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mailbox(settings: Any) -> Iterator[Mailbox]:
    """aiosmtpd on a free port; the settings send email there by SMTP."""
    box = Mailbox("127.0.0.1", free_port())
    controller = Controller(box, hostname=box.host, port=box.port)
    controller.start()
    settings.TERRET_EMAIL_ON = True
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": box.host, "port": box.port, "timeout": 5},
        }
    }
    yield box
    controller.stop()


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    """A local HTTP server taking webhooks; 127.0.0.1 is allowed as a private host."""
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["127.0.0.1"]
    server = Receiver()
    yield server
    server.close()
