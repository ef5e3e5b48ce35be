"""The per-session policy editor."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from policies_app import services
from sessions_app.models import Event, Session

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def url(session: Session) -> str:
    return f"/sessions/{session.id}/policy/"


def policies(session: Session) -> list[list[str]]:
    rows = Event.objects.filter(session=session, kind="policy/updated").order_by("seq").values_list("data", flat=True)
    return [d["patterns"] for d in rows]


@pytest.fixture
def oclient(client: Client, session: Session) -> Client:
    client.force_login(session.owner)
    return client


def test_editor_shows_the_floor_until_a_policy_is_set(oclient: Client, session: Session) -> None:
    html = oclient.get(url(session)).content.decode()
    assert "profile's floor" in html and "<code>clock.*</code>" in html
    assert "No policy changes yet." in html
    assert '<textarea name="patterns"' in html and "clock.*</textarea>" in html


def test_save_appends_and_shows_history(oclient: Client, session: Session) -> None:
    response = oclient.post(url(session), {"patterns": "workspace.*\n\n  mcp.time.*  \n"})
    assert response.status_code == 302 and response["Location"] == url(session)
    assert policies(session) == [["workspace.*", "mcp.time.*"]]
    html = oclient.get(url(session)).content.decode()
    assert "Policy saved" in html and "The session's own policy" in html
    assert "<code>workspace.*</code>, <code>mcp.time.*</code>" in html and "owner" in html


def test_bad_pattern_is_a_clear_error_and_appends_nothing(oclient: Client, session: Session) -> None:
    response = oclient.post(url(session), {"patterns": "workspace.*\nrm -rf /"})
    html = response.content.decode()
    assert response.status_code == 400 and response["X-Terret-Error"] == "invalid_pattern"
    assert "pattern 2 (&#x27;rm -rf /&#x27;)" in html and "whitespace" in html
    assert "rm -rf /</textarea>" in html  # the user's text is kept for fixing
    assert policies(session) == []
    # htmx: 200 so the fragment swaps, the error in it.
    response = oclient.post(url(session), {"patterns": "a..b"}, **HTMX)
    assert response.status_code == 200 and response["X-Terret-Error"] == "invalid_pattern"
    assert response.content.decode().lstrip().startswith('<div id="policy-editor">')
    assert policies(session) == []


def test_htmx_save_returns_the_fragment(oclient: Client, session: Session) -> None:
    response = oclient.post(url(session), {"patterns": "*"}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and "Policy saved" in html and "<html" not in html
    assert policies(session) == [["*"]]


def test_empty_policy_denies_everything(oclient: Client, session: Session) -> None:
    oclient.post(url(session), {"patterns": ""})
    assert policies(session) == [[]]
    assert "every tool call is denied" in oclient.get(url(session)).content.decode()


def test_reviewer_sees_but_cannot_edit(client: Client, session: Session, make_user: Any) -> None:
    from django.contrib.auth.models import Permission

    reviewer = make_user("rev")
    reviewer.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    services.update_policy(session.id, ["clock.*"], user=session.owner)
    client.force_login(reviewer)
    html = client.get(url(session)).content.decode()
    assert "<code>clock.*</code>" in html and "<textarea" not in html
    assert client.post(url(session), {"patterns": "*"}).status_code == 403
    assert policies(session) == [["clock.*"]]


def test_admin_validates_the_floor(client: Client, django_user_model: Any, profile: Any) -> None:
    admin = django_user_model.objects.create_superuser("admin", password="pw")
    client.force_login(admin)
    url = f"/admin/sessions_app/agentprofile/{profile.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None}
    for inline in page.context["inline_admin_formsets"]:  # what the page's inlines send (their management form)
        management = inline.formset.management_form
        data.update({management.add_prefix(k): v for k, v in management.initial.items()})
    data.update(
        {
            "roles": "{}",
            "builtin_tools": ["clock.now"],
            "mcp_servers": "[]",
            "approvals": "{}",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
            "allow_floor": '["clock.*", "bad pattern"]',
        }
    )
    response = client.post(url, data)
    assert response.status_code == 200 and "pattern 2" in response.content.decode()
    profile.refresh_from_db()
    assert profile.allow_floor == ["clock.*"]
    data["allow_floor"] = '["workspace.*"]'  # it blocks clock.now, a tool of the profile's own: confirmed
    assert client.post(url, data).status_code == 200
    data["confirm_floor"] = "on"
    assert client.post(url, data).status_code == 302
    profile.refresh_from_db()
    assert profile.allow_floor == ["workspace.*"]
