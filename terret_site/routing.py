"""The websocket routes: each door's consumer bound to its path by name
(the paths are in sessions_app/live/paths.py, where pages reverse them)."""

from __future__ import annotations

from typing import Any

from django.urls import re_path

from approvals_app.consumers import ApprovalsConsumer
from sessions_app.live.paths import ROUTES
from sessions_app.sockets.session import SessionConsumer
from sessions_app.web.console_socket import ConsoleConsumer
from sessions_app.web.dashboard_socket import DashboardConsumer
from sessions_app.web.page_socket import ChatPageConsumer

CONSUMERS: dict[str, Any] = {
    "session": SessionConsumer,
    "chat": ChatPageConsumer,
    "approvals": ApprovalsConsumer,
    "dashboard": DashboardConsumer,
    "console": ConsoleConsumer,
}

websocket_urlpatterns: list[Any] = [
    re_path(ROUTES[name], consumer.as_asgi(), name=name) for name, consumer in CONSUMERS.items()
]
