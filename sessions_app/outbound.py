"""Outbound URLs, checked against server-side request forgery.

A URL a user gives (a notification webhook; next, a monitor's feed) must not
make the server reach its own network: a host that is, or resolves to, a
private, loopback, link-local, multicast or otherwise non-global address is
refused, unless the setting TERRET_ALLOW_PRIVATE_HOSTS (a comma-separated list
of host names or addresses, as written in the URL) names it.

The check runs twice: when the URL is saved (`check_url`, a clear error for
the person typing it), and when a request is made (`request`): the host is
resolved again, every address it resolves to is checked, and the connection
goes to the checked address itself, so a name that resolves differently a
second time (DNS rebinding) cannot slip a private address in between. TLS
still verifies the certificate against the host name (SNI). Redirects are
not followed: a redirect is an answer, not a new target.

This module sits in the base room (docs/architecture.md): it imports nothing
of the project but its errors, so any room may use it.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from sessions_app.errors import UnsafeUrl

MAX_URL_CHARS = 2000
SCHEMES = {"http": 80, "https": 443}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Target:
    """A URL taken apart: the host as written (lowercase, no brackets)."""

    url: str
    scheme: str
    host: str
    port: int
    path: str  # the path and query, at least "/"


def parse(url: str) -> Target:
    """The URL's parts, or UnsafeUrl for one that is not an absolute http(s)
    URL with a host and no credentials."""
    if not isinstance(url, str) or not url.strip():
        raise UnsafeUrl("the URL is empty")
    if len(url) > MAX_URL_CHARS:
        raise UnsafeUrl(f"the URL is longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"the URL is malformed: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise UnsafeUrl("the URL must start with http:// or https://")
    if not parts.hostname:
        raise UnsafeUrl("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("the URL must not carry a user name or password")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(url.strip(), parts.scheme, parts.hostname.lower(), port or SCHEMES[parts.scheme], path)


def private_allowed(host: str) -> bool:
    """Whether TERRET_ALLOW_PRIVATE_HOSTS names this host (as the URL writes it)."""
    allowed = {h.strip().lower().strip("[]") for h in settings.TERRET_ALLOW_PRIVATE_HOSTS}
    return host.lower().strip("[]") in allowed


def is_public(address: Address) -> bool:
    """A global unicast address; an IPv4-mapped IPv6 address is judged as its IPv4."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return bool(address.is_global and not address.is_multicast)


def resolve(target: Target) -> list[Address]:
    """Every address the host resolves to, each checked; UnsafeUrl if one is
    not public (and the host is not allowed) or the host does not resolve."""
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise UnsafeUrl(f"the host {target.host} does not resolve ({exc})") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    if not addresses:
        raise UnsafeUrl(f"the host {target.host} does not resolve")
    if not private_allowed(target.host):
        for address in addresses:
            if not is_public(address):
                raise UnsafeUrl(
                    f"the host {target.host} is (or resolves to) {address}, a private, loopback or link-local "
                    "address; TERRET_ALLOW_PRIVATE_HOSTS may name it"
                )
    return addresses


def check_url(url: str) -> Target:
    """The URL parsed and its host resolved and checked (UnsafeUrl if not)."""
    target = parse(url)
    resolve(target)
    return target


def request(method: str, url: str, *, content: bytes, headers: dict[str, str], timeout: float) -> httpx.Response:
    """One request to `url`, connected to an address checked just now (see
    the module docstring). UnsafeUrl if the URL fails the check; httpx's
    errors for the network."""
    target = parse(url)
    address = resolve(target)[0]
    literal = f"[{address}]" if address.version == 6 else str(address)
    default_port = SCHEMES[target.scheme] == target.port
    host_header = target.host if default_port else f"{target.host}:{target.port}"
    pinned = f"{target.scheme}://{literal}:{target.port}{target.path}"
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        built = client.build_request(
            method, pinned, content=content, headers={**headers, "Host": host_header}, extensions=extensions
        )
        return client.send(built)
