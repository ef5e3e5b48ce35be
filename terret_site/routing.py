from __future__ import annotations

from typing import Any

from django.urls import re_path

from approvals_app.consumers import ApprovalsConsumer
from sessions_app.sockets.dashboard import DashboardConsumer
from sessions_app.sockets.session import SessionConsumer

websocket_urlpatterns: list[Any] = [
    re_path(r"^ws/sessions/(?P<session_id>[^/]+)/?$", SessionConsumer.as_asgi()),
    # The reviewer's live queue (hints only; see approvals_app/consumers.py).
    re_path(r"^ws/approvals/?$", ApprovalsConsumer.as_asgi()),
    # Dashboard refetch hints (see sessions_app/dashboard_consumers.py).
    re_path(r"^ws/dashboard/?$", DashboardConsumer.as_asgi()),
]
