"""Issue 34, part 7: small defects of the pages, each with its test (the
others are in test_settings_tokens.py, test_schedules_page.py,
test_truthful_state.py and tests/browser/test_chat_page.py)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings

from sessions_app.models import Session
from sessions_app.services import tokens
from tests.helpers import client_for

pytestmark = [pytest.mark.django_db]

NO_SUCH = uuid.UUID("5b0c8f4e-2d1a-4e7b-9c3d-000000000404")
README = Path(__file__).resolve().parents[3] / "README.md"


@override_settings(DEBUG=True)
@pytest.mark.parametrize(
    "path",
    # A fixed id: pytest-xdist's processes must collect the same test names.
    [f"/sessions/{NO_SUCH}/", "/sessions/not-a-session/", f"/sessions/{NO_SUCH}/context/", "/no/such/page/"],
)
def test_with_debug_on_an_unknown_session_gets_the_styled_404(owner: Any, path: str) -> None:
    r = client_for(owner).get(path)
    html = r.content.decode()
    assert r.status_code == 404
    assert "errors/404.html" in [t.name for t in r.templates]
    assert "Django tried these URL patterns" not in html and "DEBUG = True" not in html


@override_settings(DEBUG=True)
def test_with_debug_on_the_api_still_answers_its_own_404(owner: Any) -> None:
    r = client_for(owner).get(f"/api/sessions/{uuid.uuid4()}/events")
    assert r.status_code in (401, 404) and r["Content-Type"].startswith("application/json")


def test_the_readme_shows_post_api_sessions_and_it_works(owner: Any, profile: Any) -> None:
    text = README.read_text()
    found = re.search(r"-d '(\{\"profile\": \"(\w+)\"\})' http://127\.0\.0\.1:8000(/api/sessions)\n", text)
    assert found, "the README shows how to start a session over the API"
    body = found.group(1).replace(found.group(2), profile.name)
    _, raw = tokens.create_token(owner, "readme")
    r = Client().post(found.group(3), body, content_type="application/json", headers={"Authorization": f"Bearer {raw}"})
    assert r.status_code == 201, r.content
    assert Session.objects.filter(id=r.json()["id"], owner=owner).exists()
