from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "terret_site.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from sessions_app.live.auth import SocketAuthStack  # noqa: E402
from terret_site.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Serves STATIC_URL from the finders (static/, app static dirs): the
        # htmx (from django-htmx) and the live client load without a CDN or a proxy.
        "http": ASGIStaticFilesHandler(django_asgi_app),
        # Cookie sockets pass AllowedHostsOriginValidator + AuthMiddlewareStack;
        # ?token= / Bearer sockets are authenticated by the token (ws_auth.py).
        "websocket": SocketAuthStack(URLRouter(websocket_urlpatterns)),
    }
)

# Embedded mode: this process is also the worker. Sweep now (turns a previous
# process left open are resumed) and periodically after that.
from django.conf import settings  # noqa: E402

if settings.TERRET_WORKER == "inprocess":
    from sessions_app.runtime import inprocess, schedules

    inprocess.start_sweeper()
    # Due schedules are this process's to fire too (runtime/schedules.py).
    schedules.start_clock(lambda: settings.TERRET_WORKER == "inprocess")
    # And the notifications' sender (sessions_app/notify/delivery.py). Not
    # under the tests: a sender thread started by any test's import of this
    # module would send, back-fill and hold SQLite's write lock in every later
    # test of the process; the sender's tests run it themselves.
    from sessions_app.notify import delivery

    if not settings.TESTING:
        delivery.start_sender(lambda: settings.TERRET_WORKER == "inprocess")
