"""API tokens: issued by a command, stored hashed, checked in constant time,
revocable in the admin."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from sessions_app.models import ApiToken
from sessions_app.services import tokens as auth
from tests.sessions_app.apiutil import bearer, call, token_for

pytestmark = pytest.mark.django_db


def test_command_prints_the_token_once_and_stores_only_its_hash(make_user):
    user = make_user("alice")
    out, err = StringIO(), StringIO()
    call_command("create_api_token", "alice", "--name", "ci bot", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    assert raw.startswith("trt_") and len(raw) > 40
    token = ApiToken.objects.get(user=user)
    assert token.name == "ci bot"
    assert token.prefix == raw[:12]
    assert token.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    # The secret part is stored nowhere: not in any column, not in the log line.
    stored = " ".join(str(getattr(token, f.attname)) for f in ApiToken._meta.concrete_fields)
    assert raw not in stored and raw[12:] not in stored
    assert raw not in err.getvalue()


def test_command_refuses_unknown_and_inactive_users(make_user):
    make_user("bob", is_active=False)
    with pytest.raises(CommandError, match="no user"):
        call_command("create_api_token", "nobody", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match="inactive"):
        call_command("create_api_token", "bob", stdout=StringIO(), stderr=StringIO())
    assert not ApiToken.objects.exists()


def test_a_token_authenticates_its_user_and_records_last_use(client, make_user):
    user = make_user()
    raw = token_for(user)
    assert ApiToken.objects.get().last_used_at is None
    response = call(client, "GET", "/api/profiles", **bearer(raw))
    assert response.status_code == 200
    assert ApiToken.objects.get().last_used_at is not None


def test_last_used_is_written_at_most_once_a_minute(make_user):
    raw = token_for(make_user())
    recent = timezone.now() - timedelta(seconds=10)
    ApiToken.objects.update(last_used_at=recent)
    assert auth.authenticate_token(raw) is not None
    assert ApiToken.objects.get().last_used_at == recent
    ApiToken.objects.update(last_used_at=timezone.now() - timedelta(minutes=5))
    auth.authenticate_token(raw)
    assert ApiToken.objects.get().last_used_at > recent


@pytest.mark.parametrize(
    "mangle",
    [
        lambda raw: raw[:-1] + ("A" if raw[-1] != "A" else "B"),  # same prefix, wrong secret
        lambda raw: raw + "x",
        lambda raw: raw[4:],  # no trt_ prefix
        lambda raw: "",
        lambda raw: "trt_" + "x" * 500,
    ],
)
def test_wrong_tokens_are_refused(client, make_user, mangle):
    raw = token_for(make_user())
    assert auth.authenticate_token(mangle(raw)) is None
    response = call(client, "GET", "/api/profiles", **bearer(mangle(raw) or "x"))
    assert response.status_code == 401


def test_revoked_tokens_and_inactive_users_are_refused(client, make_user):
    user = make_user()
    revoked, live = token_for(user), token_for(user)
    auth.revoke(ApiToken.objects.filter(prefix=revoked[:12]))
    assert call(client, "GET", "/api/profiles", **bearer(revoked)).status_code == 401
    assert call(client, "GET", "/api/profiles", **bearer(live)).status_code == 200
    user.is_active = False
    user.save()
    assert call(client, "GET", "/api/profiles", **bearer(live)).status_code == 401


def test_tokens_sharing_a_prefix_still_match_only_their_own_hash(make_user):
    first, second = make_user(), make_user()
    raw = token_for(first)
    # A second row with the same prefix (astronomically unlikely, but allowed).
    ApiToken.objects.create(user=second, prefix=raw[:12], key_hash=auth.hash_token(raw + "other"))
    found = auth.authenticate_token(raw)
    assert found is not None and found.user == first


# ---------------------------------------------------------------- admin


@pytest.fixture
def admin_client(client, make_user):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def test_admin_lists_tokens_by_prefix_without_their_hash(admin_client, make_user):
    raw = token_for(make_user("carol"), "laptop")
    token = ApiToken.objects.get()
    page = admin_client.get("/admin/sessions_app/apitoken/").content.decode()
    assert token.prefix in page and "laptop" in page
    assert token.key_hash not in page and raw not in page
    change = admin_client.get(f"/admin/sessions_app/apitoken/{token.pk}/change/").content.decode()
    assert token.key_hash not in change
    assert admin_client.get("/admin/sessions_app/apitoken/add/").status_code == 403


def test_admin_revoke_action_stops_the_token(admin_client, client, make_user):
    raw = token_for(make_user("dave"))
    token = ApiToken.objects.get()
    response = admin_client.post(
        "/admin/sessions_app/apitoken/",
        {"action": "revoke_tokens", "_selected_action": [token.pk]},
        follow=True,
    )
    assert response.status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert auth.authenticate_token(raw) is None
