"""The websocket routes' paths, by name, and their reversal: pages name a
socket by its route's name, as they name pages with {% url %}. The routes
take an optional trailing slash. terret_site/routing.py binds each to its
consumer; the paths live here, beneath every door, because the pages of
several doors name sockets that other doors serve."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import re_path
from django.urls.resolvers import RegexPattern, URLResolver

ROUTES: dict[str, str] = {
    # The session protocol (docs/protocol.md): JSON frames both ways.
    "session": r"^ws/sessions/(?P<session_id>[^/]+)/?$",
    # The chat page: rendered fragments for htmx (sessions_app/web/page_socket.py).
    "chat": r"^ws/sessions/(?P<session_id>[^/]+)/page/?$",
    # The reviewer's live queue (approvals_app/consumers.py).
    "approvals": r"^ws/approvals/?$",
    # The dashboard (web/dashboard_socket.py).
    "dashboard": r"^ws/dashboard/?$",
    # The operators' console, a live fleet view (web/console_socket.py).
    "console": r"^ws/ops/?$",
}


def _unroutable(*args: Any, **kwargs: Any) -> HttpResponse:  # pragma: no cover - only reversed, never called
    raise RuntimeError("socket paths are reversed here, served by terret_site/routing.py")


_resolver = URLResolver(RegexPattern(r"^"), [re_path(rx, _unroutable, name=name) for name, rx in ROUTES.items()])


def socket_url(name: str, **kwargs: Any) -> str:
    """The path of the socket route `name`, e.g. socket_url("chat", session_id=...)."""
    return "/" + _resolver.reverse(name, **kwargs).rstrip("/") + "/"
