"""The SSRF check (sessions_app/outbound.py): at save time and again at connect time."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from sessions_app import outbound
from sessions_app.errors import UnsafeUrl
from tests.sessions_app.notify.conftest import Receiver


def resolving_to(monkeypatch: pytest.MonkeyPatch, *answers: str) -> list[str]:
    """getaddrinfo answers each call with the next address (the last one repeats)."""
    asked: list[str] = []
    queue = list(answers)

    def fake(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        asked.append(host)
        address = queue.pop(0) if len(queue) > 1 else queue[0]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return asked


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://localhost:8080/hook",
        "http://10.1.2.3/",
        "http://192.168.0.10/",
        "http://172.16.5.5/",
        "http://169.254.169.254/latest/meta-data/",  # link-local: the cloud metadata service
        "http://100.64.0.1/",  # shared address space
        "http://0.0.0.0/",
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[::ffff:127.0.0.1]/",  # IPv4-mapped loopback
        "http://224.0.0.1/",
    ],
)
def test_private_loopback_and_link_local_are_refused(url: str, settings: Any) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = []
    with pytest.raises(UnsafeUrl, match="private, loopback or link-local"):
        outbound.check_url(url)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("", "empty"),
        ("ftp://example.com/x", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("https:///nohost", "no host"),
        ("https://user:pw@example.com/", "user name or password"),
        ("http://example.com:99999/", "malformed"),
        ("https://" + "a" * 2000 + ".com/", "longer than"),
    ],
)
def test_malformed_urls_are_refused_with_a_reason(url: str, why: str) -> None:
    with pytest.raises(UnsafeUrl, match=why):
        outbound.check_url(url)


def test_a_name_resolving_to_a_private_address_is_refused(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = []
    resolving_to(monkeypatch, "10.0.0.7")
    with pytest.raises(UnsafeUrl, match="hooks.example.com is .* 10.0.0.7"):
        outbound.check_url("https://hooks.example.com/x")


def test_a_public_address_passes(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = []
    resolving_to(monkeypatch, "93.184.216.34")
    target = outbound.check_url("https://Hooks.Example.com/x?y=1")
    assert (target.scheme, target.host, target.port, target.path) == ("https", "hooks.example.com", 443, "/x?y=1")


def test_allowed_private_hosts_are_named_as_the_url_writes_them(settings: Any) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["127.0.0.1", "LOCALHOST", "[::1]"]
    assert outbound.check_url("http://127.0.0.1:9/x").host == "127.0.0.1"
    assert outbound.check_url("http://localhost/x").host == "localhost"
    assert outbound.check_url("http://[::1]/x").host == "::1"
    with pytest.raises(UnsafeUrl):
        outbound.check_url("http://127.0.0.2/x")  # another address is not named


def test_unresolvable_host_is_refused(settings: Any) -> None:
    with pytest.raises(UnsafeUrl, match="does not resolve"):
        outbound.check_url("http://no-such-host.invalid/")


def test_rebinding_is_caught_at_connect_time(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """A name that was public when the URL was saved and resolves to loopback
    when the request is made is refused then, before any connection."""
    settings.TERRET_ALLOW_PRIVATE_HOSTS = []
    receiver = Receiver()
    try:
        port = receiver.server.server_address[1]
        asked = resolving_to(monkeypatch, "93.184.216.34", "127.0.0.1")
        url = f"http://rebind.example:{port}/hook"
        outbound.check_url(url)  # saved: public
        with pytest.raises(UnsafeUrl, match="127.0.0.1"):
            outbound.request("POST", url, content=b"{}", headers={}, timeout=2)
        assert asked == ["rebind.example", "rebind.example"]
        assert receiver.deliveries == []
    finally:
        receiver.close()


def test_request_connects_to_the_checked_address_with_the_host_name(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["hooks.internal"]
    receiver = Receiver()
    try:
        port = receiver.server.server_address[1]
        resolving_to(monkeypatch, "127.0.0.1")
        response = outbound.request(
            "POST", f"http://hooks.internal:{port}/hook?a=1", content=b"x", headers={"X-A": "1"}, timeout=2
        )
        assert response.status_code == 200
        [delivery] = receiver.deliveries
        assert delivery.headers["host"] == f"hooks.internal:{port}" and delivery.body == b"x"
    finally:
        receiver.close()


def test_redirects_are_not_followed(settings: Any) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["127.0.0.1"]
    receiver = Receiver()
    receiver.statuses = [302]
    try:
        response = outbound.request("POST", receiver.url, content=b"x", headers={}, timeout=2)
        assert response.status_code == 302 and len(receiver.deliveries) == 1
    finally:
        receiver.close()
