from __future__ import annotations

from sessions_app.sockets.urls import websocket_urlpatterns

__all__ = ["websocket_urlpatterns"]
