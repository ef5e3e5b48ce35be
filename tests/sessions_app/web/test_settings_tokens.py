"""API tokens from the settings page (services/tokens.py): made and shown
once, listed by prefix only, revoked; the API takes a made token and refuses
a revoked one."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from sessions_app.errors import InvalidInput
from sessions_app.models import ApiToken
from sessions_app.services import tokens
from tests.helpers import client_for

pytestmark = pytest.mark.django_db


def api_status(raw: str) -> int:
    # The API's own authentication: a GET of a session that does not exist
    # is a 404 to a good token and a 401 to a bad one.
    return (
        Client()
        .get("/api/sessions/00000000-0000-0000-0000-000000000000/events", headers={"Authorization": f"Bearer {raw}"})
        .status_code
    )


def test_the_settings_page_makes_a_token_shows_it_once_and_revokes_it(owner: Any) -> None:
    c = client_for(owner)
    assert c.get(reverse("sessions:settings")).status_code == 200
    made = c.post(reverse("sessions:token_create"), {"name": "laptop"})
    # Post, redirect, get: reloading the page it lands on makes no second token (issue 34).
    assert made.status_code == 302 and made["Location"] == reverse("sessions:settings")
    r = c.get(made["Location"])
    assert r.status_code == 200 and r["Cache-Control"] == "no-store"
    found = re.search(r'<code id="new-token">(trt_[\w-]+)</code>', r.content.decode())
    assert found is not None
    raw = found.group(1)
    token = ApiToken.objects.get(user=owner)
    assert token.name == "laptop" and raw.startswith(token.prefix) and raw not in token.key_hash
    assert api_status(raw) == 404
    again = c.get(reverse("sessions:settings")).content.decode()  # a reload
    assert raw not in again and f"{token.prefix}…" in again  # shown once, then by prefix only
    assert ApiToken.objects.filter(user=owner).count() == 1
    c.post(reverse("sessions:token_revoke", args=[token.pk]))
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert api_status(raw) == 401


@pytest.mark.parametrize("name", ["", "   ", "n" * 101])
def test_a_bad_name_is_refused_and_nothing_made(owner: Any, name: str) -> None:
    r = client_for(owner).post(reverse("sessions:token_create"), {"name": name})
    assert r.status_code == 400 and 'id="token-error"' in r.content.decode()
    assert not ApiToken.objects.exists()


def test_nobody_revokes_anothers_token(owner: Any, make_user: Callable[..., Any]) -> None:
    token, raw = tokens.create_token(owner, "mine")
    mallory = make_user("mallory")
    with pytest.raises(InvalidInput):
        tokens.revoke_token(mallory, token.pk)
    client_for(mallory).post(reverse("sessions:token_revoke", args=[token.pk]))
    token.refresh_from_db()
    assert token.revoked_at is None and api_status(raw) == 404
    assert "mine" not in client_for(mallory).get(reverse("sessions:settings")).content.decode()


def test_the_pages_need_sign_in_and_csrf(owner: Any) -> None:
    assert Client().get(reverse("sessions:settings")).status_code == 302
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(reverse("sessions:token_create"), {"name": "x"}).status_code == 403
    assert not ApiToken.objects.exists()
