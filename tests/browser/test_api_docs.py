"""The browsable API docs at /api/docs render in Chromium with no network
beyond the server itself (Swagger UI from django-ninja's static files, no
CDN), at 1280 and 375 px, and list the session listing endpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.parametrize("width", [1280, 375])
def test_api_docs_render_offline(
    start_server: Callable[..., Any], new_page: Callable[..., Any], make_user: Callable[..., Any], width: int
) -> None:
    server = start_server(TERRET_WORKER="manual")
    page = new_page(server, make_user("alice"), width=width)
    foreign: list[str] = []
    own = urlparse(server.url).netloc

    def only_local(route: Any) -> None:
        if urlparse(route.request.url).netloc == own:
            route.continue_()
        else:
            foreign.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto("/api/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Terret API", timeout=20_000)
    expect(page.get_by_text("/api/sessions", exact=True).first).to_be_visible()
    assert foreign == [], f"the docs page asked the network for {foreign}"
    assert page.js_errors == []
