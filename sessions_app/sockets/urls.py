"""The websocket routes, mounted by terret_site/routing.py; their paths are in paths.py."""

from __future__ import annotations

from typing import Any

from django.urls import re_path

from approvals_app.consumers import ApprovalsConsumer
from sessions_app.sockets.dashboard import DashboardConsumer
from sessions_app.sockets.page import ChatPageConsumer
from sessions_app.sockets.session import SessionConsumer
from sessions_app.web.socket_paths import ROUTES

CONSUMERS: dict[str, Any] = {
    "session": SessionConsumer,
    "chat": ChatPageConsumer,
    "approvals": ApprovalsConsumer,
    "dashboard": DashboardConsumer,
}

websocket_urlpatterns: list[Any] = [
    re_path(ROUTES[name], consumer.as_asgi(), name=name) for name, consumer in CONSUMERS.items()
]
