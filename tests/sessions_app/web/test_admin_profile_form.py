"""The admin's profile form (issue 34, part 5): tool checkboxes from the
registry with each tool's approval mode and replay policy, a model field
that lists the providers and warns about a missing API key, an empty allow
floor that becomes the chosen tools, a floor that blocks the profile's own
tool saved only when confirmed, and help with an example under every JSON field."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from sessions_app.models import AgentProfile
from tests.sessions_app.web.test_admin_agents import form_data

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

ADD = "admin:sessions_app_agentprofile_add"


@pytest.fixture
def root(client: Client, django_user_model: Any) -> Client:
    client.force_login(django_user_model.objects.create_superuser("root", "", "root-pass-123"))
    return client


def data(**changes: Any) -> dict[str, Any]:
    return form_data(**{"mcp_servers": [], "approvals": {}, "roles": {}, **changes})


def test_the_add_page_shows_tools_providers_and_help(root: Client, settings: Any) -> None:
    settings.TERRET_LLM_API_KEY = ""
    html = root.get(reverse(ADD)).content.decode()
    boxes = re.findall(r'<input type="checkbox" name="builtin_tools" value="([^"]+)"', html)
    assert {"clock.now", "workspace.write", "debug.charge"} <= set(boxes)
    assert "workspace.write · approval: policy · replay: reconcile" in html
    assert "debug.charge · approval: never · replay: never" in html
    assert 'name="main_model"' in html and 'list="profile-models"' in html and '<option value="demo/offline">' in html
    assert "openai-compatible" in html and "no API key: set TERRET_LLM_API_KEY" in html
    for field in ("roles", "mcp_servers", "allow_floor", "approvals", "context_windows", "image_roles"):
        help_text = re.search(rf'<div class="help" id="id_{field}_helptext">(.*?)</div>', html, re.S)
        assert help_text is not None and "Example" in help_text.group(1), field
    settings.TERRET_LLM_API_KEY = "k"
    assert "no API key" not in root.get(reverse(ADD)).content.decode()


def test_an_empty_floor_becomes_the_chosen_tools(root: Client) -> None:
    r = root.post(
        reverse(ADD),
        data(builtin_tools=["clock.now", "debug.charge"], mcp_servers=[{"name": "t", "command": "y"}]),
    )
    assert r.status_code == 302, r.context["adminform"].form.errors
    profile = AgentProfile.objects.get(name="checked")
    assert profile.builtin_tools == ["clock.now", "debug.charge"]
    assert profile.allow_floor == ["clock.now", "debug.charge", "mcp.t.*"]


def test_a_floor_blocking_a_chosen_tool_needs_confirmation(root: Client) -> None:
    r = root.post(reverse(ADD), data(builtin_tools=["clock.now", "debug.charge"], allow_floor=["clock.*"]))
    assert r.status_code == 200
    errors = r.context["adminform"].form.errors
    assert "This floor blocks debug.charge" in errors["allow_floor"][0]
    assert not AgentProfile.objects.filter(name="checked").exists()
    r = root.post(
        reverse(ADD), data(builtin_tools=["clock.now", "debug.charge"], allow_floor=["clock.*"], confirm_floor="on")
    )
    assert r.status_code == 302
    assert AgentProfile.objects.get(name="checked").allow_floor == ["clock.*"]


def test_the_model_field_sets_the_main_role_and_warns_without_a_key(root: Client, settings: Any) -> None:
    settings.TERRET_LLM_API_KEY = ""
    r = root.post(
        reverse(ADD),
        data(builtin_tools=["clock.now"], roles={"titler": "demo/offline"}, main_model=" openai/x "),
        follow=True,
    )
    assert r.status_code == 200
    assert AgentProfile.objects.get(name="checked").roles == {"titler": "demo/offline", "main": "openai/x"}
    said = [str(m) for m in r.context["messages"]]
    assert any("openai/x cannot be reached" in m and "TERRET_LLM_API_KEY" in m for m in said), said
    pk = AgentProfile.objects.get(name="checked").pk
    change = root.get(reverse("admin:sessions_app_agentprofile_change", args=[pk]))
    assert 'value="openai/x"' in change.content.decode()  # the field shows the saved main role


def test_a_workspace_server_is_checked_on_save(root: Client) -> None:
    """`"workspace": true` (docs/documents.md): a bad value is the field's error, and nothing is saved."""
    bad = {"name": "files", "url": "https://mcp.example.com/mcp", "workspace": True}
    r = root.post(reverse(ADD), data(mcp_servers=[bad]))
    assert r.status_code == 200
    assert "workspace applies to a stdio server only" in str(r.context["adminform"].form.errors["mcp_servers"])
    assert not AgentProfile.objects.filter(name="checked").exists()
    good = {"name": "files", "command": "npx", "args": ["@modelcontextprotocol/server-filesystem", "{workspace}"]}
    r = root.post(reverse(ADD), data(mcp_servers=[{**good, "workspace": True}]))
    assert r.status_code == 302, r.context["adminform"].form.errors
    assert AgentProfile.objects.get(name="checked").mcp_servers == [{**good, "workspace": True}]
