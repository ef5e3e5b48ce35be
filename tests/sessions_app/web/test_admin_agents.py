"""The admin for agent profiles (validated on save, each problem on its
field: runtime/profiles.py check_profile) and for live agents (read-only,
with a "Dispose selected agents" action that names the operator)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from sessions_app import log, services
from sessions_app.admin import AgentProfileForm
from sessions_app.models import Agent, AgentProfile, Session
from sessions_app.runtime.profiles import check_profile
from tests.helpers import events

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

GOOD = {
    "roles": {"main": "openai/gpt-4o-mini", "titler": "demo/offline"},
    "builtin_tools": ["clock.now", "workspace.write"],
    "mcp_servers": [{"name": "time", "command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}}],
    "approvals": {"workspace.write": "always", "clock.now": "never", "mcp.time.get_current_time": "policy"},
}


def check(**changes: Any) -> dict[str, list[str]]:
    return check_profile(**{**GOOD, **changes})


# ---------------------------------------------------------------- check_profile


def test_a_good_profile_has_no_problems() -> None:
    assert check() == {}
    assert check_profile(roles={}, builtin_tools=[], mcp_servers=[], approvals={}) == {}


@pytest.mark.parametrize(
    ("roles", "needle"),
    [
        ({"mian": "openai/gpt-4o"}, "unknown model role 'mian'"),
        ({"main": ""}, "the main role needs a model spec"),
        ({"main": "   "}, "the main role needs a model spec"),
        ({"compactor": 7}, "the compactor role needs a model spec"),
        (["main"], "must be an object"),
    ],
)
def test_roles(roles: Any, needle: str) -> None:
    problems = check(roles=roles)
    assert list(problems) == ["roles"] and needle in " ".join(problems["roles"])


@pytest.mark.parametrize(
    ("windows", "needle"),
    [
        ({"mian": 8000}, "unknown model role 'mian'"),
        ({"main": 100}, "at least 1024"),
        ({"main": 8000.5}, "whole number of tokens"),
        ({"compactor": True}, "whole number of tokens"),
        ([8000], "must be an object"),
    ],
)
def test_context_windows(windows: Any, needle: str) -> None:
    assert check(context_windows={"main": 128_000, "compactor": 32_000}) == {}
    problems = check(context_windows=windows)
    assert list(problems) == ["context_windows"] and needle in " ".join(problems["context_windows"])


@pytest.mark.parametrize(
    ("tools", "needle"),
    [
        (["clock.nwo"], "unknown built-in tool 'clock.nwo'; known built-ins: clock.now"),
        ([7], "unknown built-in tool 7"),
        (["clock.now", "clock.now"], "'clock.now' is listed twice"),
        ("clock.now", "must be a list"),
    ],
)
def test_builtin_tools(tools: Any, needle: str) -> None:
    problems = check(builtin_tools=tools, approvals={})
    assert list(problems) == ["builtin_tools"] and needle in " ".join(problems["builtin_tools"])


@pytest.mark.parametrize(
    ("servers", "needle"),
    [
        ([{"command": "uvx"}], "MCP server name None must be 1-64 letters"),
        ([{"name": "bad name", "command": "uvx"}], "MCP server name 'bad name'"),
        ([{"name": "t"}], "MCP server 't': command must be a non-empty string"),
        ([{"name": "t", "command": ["uvx"]}], "command must be a non-empty string"),
        ([{"name": "t", "command": "uvx", "args": "mcp-server-time"}], "args must be a list of strings"),
        ([{"name": "t", "command": "uvx", "args": [1]}], "args must be a list of strings"),
        ([{"name": "t", "command": "uvx", "env": {"TZ": 1}}], "env must map strings to strings"),
        ([{"name": "t", "command": "uvx", "env": ["TZ=UTC"]}], "env must map strings to strings"),
        ([{"name": "t", "command": "uvx", "timeout": 0}], "timeout must be a number of seconds"),
        ([{"name": "t", "command": "uvx", "argz": []}], "server 't': unknown key(s) argz"),
        ([{"name": "t", "command": "a"}, {"name": "t", "command": "b"}], "two MCP servers are named 't'"),
        (["uvx mcp-server-time"], "server 1: must be an object with a name and a command"),
        ({"name": "t", "command": "uvx"}, "must be a list of servers"),
    ],
)
def test_mcp_servers(servers: Any, needle: str) -> None:
    problems = check(mcp_servers=servers, approvals={})
    assert list(problems) == ["mcp_servers"] and needle in " ".join(problems["mcp_servers"]), problems


@pytest.mark.parametrize(
    ("approvals", "needle"),
    [
        ({"workspace.write": "sometimes"}, "'sometimes' is not an approval mode; use one of never, policy, always"),
        ({"workspace.write": True}, "True is not an approval mode"),
        ({"no.such.tool": "always"}, "no.such.tool: no such tool"),
        ({"workspace.read": "always"}, "this profile does not enable that built-in"),
        ({"mcp.other.tool": "always"}, "names no tool of this profile's MCP servers"),
        ({"mcp.time": "always"}, "names no tool of this profile's MCP servers"),
        (["workspace.write"], "must be an object"),
    ],
)
def test_approvals(approvals: Any, needle: str) -> None:
    problems = check(approvals=approvals)
    assert list(problems) == ["approvals"] and needle in " ".join(problems["approvals"]), problems


def test_every_problem_is_reported_at_once() -> None:
    problems = check_profile(
        roles={"x": "y"}, builtin_tools=["nope"], mcp_servers=[{"name": "t"}], approvals={"nope": "maybe"}
    )
    assert set(problems) == {"roles", "builtin_tools", "mcp_servers", "approvals"}
    assert len(problems["approvals"]) == 2  # the mode and the name


# ---------------------------------------------------------------- the profile form and admin


def form_data(**changes: Any) -> dict[str, Any]:
    data = {
        "name": "checked",
        "description": "",
        "allow_floor": "[]",
        "compaction_budget": "100000",
        "max_schedules": "20",
        "min_schedule_seconds": "60",
        "schedule_pause_after": "3",
        "summarizer": "role",
        "on_stall": "report",
        "on_expiry": "deny",  # used only with an approval deadline (none here)
        "system_prompt": "",
        "upgrade_policy": "next_turn",
        "max_waiting_inputs": "1000",
        "max_waiting_bytes": "8388608",
        "max_passive_inputs": "100",
        "command_allow": "[]",
        "max_task_depth": "3",
        "max_live_children": "8",
        # The page's inline (the profile's notification channels) sends its management form; none added here.
        "notify_settings-TOTAL_FORMS": "0",
        "notify_settings-INITIAL_FORMS": "0",
        "created_at": "2026-01-01 10:00:00",  # the form's own widget; the admin splits it in two
        "created_at_0": "2026-01-01",
        "created_at_1": "10:00:00",
        **{k: json.dumps(v) for k, v in GOOD.items()},
    }
    data.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in changes.items()})
    # The tools are checkboxes: one value per ticked tool, as a browser sends them.
    tools = changes.get("builtin_tools", GOOD["builtin_tools"])
    data["builtin_tools"] = tools
    return data


def test_the_form_puts_each_problem_on_its_field() -> None:
    form = AgentProfileForm(
        data=form_data(
            roles={"mian": "x"},
            builtin_tools=["clock.nwo"],
            mcp_servers=[{"name": "t", "command": ""}],
            approvals={"workspace.write": "sometimes"},
        )
    )
    assert not form.is_valid()
    assert set(form.errors) == {"roles", "builtin_tools", "mcp_servers", "approvals"}
    assert "unknown model role 'mian'" in form.errors["roles"][0]
    assert "unknown built-in tool 'clock.nwo'" in form.errors["builtin_tools"][0]
    assert "command must be a non-empty string" in form.errors["mcp_servers"][0]
    assert "'sometimes' is not an approval mode" in " ".join(form.errors["approvals"])


def test_the_form_accepts_a_good_profile_and_blank_fields() -> None:
    assert AgentProfileForm(data=form_data()).is_valid()
    blank = AgentProfileForm(data=form_data(roles="", builtin_tools="", mcp_servers="", approvals=""))
    assert blank.is_valid(), blank.errors
    profile = blank.save()
    assert (profile.roles, profile.builtin_tools, profile.mcp_servers, profile.approvals) == ({}, [], [], {})


def test_json_that_does_not_parse_keeps_its_own_error() -> None:
    form = AgentProfileForm(data=form_data(roles="{not json"))
    assert not form.is_valid()
    assert list(form.errors) == ["roles"] and "JSON" in form.errors["roles"][0]


@pytest.fixture
def staff(client: Client, django_user_model: Any) -> Client:
    client.force_login(django_user_model.objects.create_superuser("root", "", "root-pass-123"))
    return client


def test_the_admin_refuses_to_save_a_bad_profile(staff: Client) -> None:
    url = reverse("admin:sessions_app_agentprofile_add")
    r = staff.post(url, form_data(builtin_tools=["clock.nwo"], approvals={}))
    assert r.status_code == 200  # the form again, with the error
    assert "unknown built-in tool" in r.content.decode()
    assert not AgentProfile.objects.filter(name="checked").exists()
    # policies_app's check of the allow floor still runs alongside (it extends this admin).
    r = staff.post(url, form_data(allow_floor=["[unclosed"], approvals={"nope": "x"}))
    assert r.status_code == 200
    errors = r.context["adminform"].form.errors
    assert {"allow_floor", "approvals"} <= set(errors), errors
    assert not AgentProfile.objects.filter(name="checked").exists()
    r = staff.post(url, form_data())
    assert r.status_code == 302
    assert AgentProfile.objects.get(name="checked").approvals == GOOD["approvals"]


# ---------------------------------------------------------------- agents


@pytest.fixture
def agents(make_user: Any) -> dict[str, Agent]:
    profile = AgentProfile.objects.create(name="ops", builtin_tools=["clock.now"])
    out = {}
    for name in ("idle", "busy"):
        session = services.create_session(make_user(f"u-{name}"), profile)
        out[name] = services.spawn_agent(session, profile, agent_id=f"agent-{name}")
    log.append(out["busy"].session_id, "turn/start", {})
    return out


def test_the_agents_admin_is_read_only(staff: Client, agents: dict[str, Agent]) -> None:
    changelist = staff.get(reverse("admin:sessions_app_agent_changelist"))
    assert changelist.status_code == 200
    body = changelist.content.decode()
    assert "agent-idle" in body and "agent-busy" in body
    assert reverse("admin:sessions_app_agent_add") not in body
    assert 'value="dispose_selected"' in body and 'value="delete_selected"' not in body
    agent = agents["idle"]
    assert staff.get(reverse("admin:sessions_app_agent_add")).status_code == 403
    change = reverse("admin:sessions_app_agent_change", args=[agent.pk])
    view = staff.get(change)
    assert view.status_code == 200 and 'name="_save"' not in view.content.decode()
    assert staff.post(change, {"agent_id": "renamed"}).status_code == 403
    delete = reverse("admin:sessions_app_agent_delete", args=[agent.pk])
    assert staff.post(delete, {"post": "yes"}).status_code == 403
    assert Agent.objects.filter(pk=agent.pk, agent_id="agent-idle").exists()


def test_dispose_disposes_idle_agents_and_refuses_busy_ones(staff: Client, agents: dict[str, Agent]) -> None:
    r = staff.post(
        reverse("admin:sessions_app_agent_changelist"),
        {"action": "dispose_selected", "_selected_action": [a.pk for a in agents.values()]},
        follow=True,
    )
    assert r.status_code == 200
    notes = [str(m) for m in get_messages(r.wsgi_request)]
    assert any("agent-busy" in n and "not disposed" in n for n in notes), notes
    assert any("Disposed 1 agent(s)." in n for n in notes), notes
    assert list(Agent.objects.values_list("agent_id", flat=True)) == ["agent-busy"]
    idle = Session.objects.get(id=agents["idle"].session_id)
    assert events(idle, "agent/disposed") == [{"agent_id": "agent-idle", "reason": "operator", "by": "root"}]
    assert events(Session.objects.get(id=agents["busy"].session_id), "agent/disposed") == []


def test_the_session_list_shows_blocked(staff: Client, agents: dict[str, Agent]) -> None:
    busy = agents["busy"].session_id
    log.append(busy, "turn/blocked", {"reason": "503", "attempts": 3})
    url = reverse("admin:sessions_app_session_changelist")
    r = staff.get(url)
    assert r.status_code == 200
    assert '<td class="field-status">blocked</td>' in r.content.decode()
    only = staff.get(url + "?status=blocked")
    assert [s.id for s in only.context["cl"].result_list] == [busy]
    idle = staff.get(url + "?status=idle")
    assert [s.id for s in idle.context["cl"].result_list] == [agents["idle"].session_id]


def test_on_stall_is_report_or_cancel() -> None:
    assert AgentProfileForm(data=form_data(on_stall="cancel")).is_valid()
    form = AgentProfileForm(data=form_data(on_stall="restart"))
    assert not form.is_valid()
    assert list(form.errors) == ["on_stall"]
