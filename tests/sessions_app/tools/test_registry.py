"""Profile → registry: built-ins, approval overrides, validation, caching."""

from __future__ import annotations

import os
import sys

import pytest

from sessions_app.llm.types import ToolSpec
from sessions_app.models import AgentProfile
from sessions_app.tools import mcp, registry
from sessions_app.tools.builtins import BUILTINS
from sessions_app.tools.registry import Registry, build_registry, registry_for_profile

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_cache():
    registry.clear_cache()
    yield
    registry.clear_cache()


def make_profile(**fields) -> AgentProfile:
    fields.setdefault("name", "agent")
    return AgentProfile.objects.create(**fields)


def test_profile_builtins_become_the_registry():
    profile = make_profile(builtin_tools=["workspace.write", "clock.now", "workspace.read"])
    reg = registry_for_profile(profile)
    assert reg.names() == ["clock.now", "workspace.read", "workspace.write"]
    assert reg.get("clock.now") is BUILTINS["clock.now"]
    assert reg.get("debug.noop") is None
    assert "workspace.read" in reg
    assert len(reg) == 3
    assert reg.degraded is False


def test_specs_are_sorted_tool_specs():
    profile = make_profile(builtin_tools=["workspace.write", "clock.now"])
    specs = registry_for_profile(profile).specs()
    assert [s.name for s in specs] == ["clock.now", "workspace.write"]
    write = BUILTINS["workspace.write"]
    assert specs[1] == ToolSpec("workspace.write", write.description, write.parameters)


def test_empty_profile_has_no_tools():
    reg = registry_for_profile(make_profile())
    assert reg.names() == []
    assert reg.specs() == []


def test_debug_tools_only_when_listed():
    assert "debug.sleep" not in registry_for_profile(make_profile(name="plain", builtin_tools=["clock.now"]))
    bench = registry_for_profile(make_profile(name="bench", builtin_tools=["debug.noop", "debug.sleep"]))
    assert bench.names() == ["debug.noop", "debug.sleep"]


def test_approval_overrides_are_applied_without_touching_builtins():
    profile = make_profile(
        builtin_tools=["workspace.write", "clock.now", "workspace.read"],
        approvals={"workspace.write": "never", "clock.now": "always", "not.offered": "always"},
    )
    reg = registry_for_profile(profile)
    assert reg["workspace.write"].approval == "never"
    assert reg["clock.now"].approval == "always"
    assert reg["workspace.read"].approval == "never"
    # Everything else about the tool is kept.
    assert reg["workspace.write"].mutating is True
    assert reg["workspace.write"].handler is BUILTINS["workspace.write"].handler
    assert BUILTINS["workspace.write"].approval == "policy"
    assert BUILTINS["clock.now"].approval == "never"


def test_unknown_builtin_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown built-in tool 'shell.exec'.*known built-ins: clock.now"):
        build_registry(["clock.now", "shell.exec"])


def test_a_profile_naming_a_builtin_the_code_lacks_gets_a_registry_that_names_it_absent():
    # Not an error here: the runtime blocks the turn on it (definition_missing) rather than failing it.
    profile = make_profile(builtin_tools=["clock.now", "shell.exec"])
    reg = registry_for_profile(profile)
    assert reg.names() == ["clock.now"] and reg.absent == ("shell.exec",)


def test_non_string_builtin_is_refused():
    with pytest.raises(ValueError, match="unknown built-in tool 5"):
        build_registry([5])  # type: ignore[list-item]


def test_invalid_approval_value_is_refused():
    profile = make_profile(builtin_tools=["clock.now"], approvals={"clock.now": "sometimes"})
    with pytest.raises(ValueError, match="'sometimes'"):
        registry_for_profile(profile)


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"command": "x"}, "name"),
        ({"name": "has.dot", "command": "x"}, "name"),
        ({"name": "s"}, "command"),
        ({"name": "s", "command": "x", "args": "-v"}, "args"),
        ({"name": "s", "command": "x", "env": {"A": 1}}, "env"),
        ({"name": "s", "command": "x", "timeout": 0}, "timeout"),
    ],
)
def test_invalid_mcp_server_config_is_refused(server, message):
    with pytest.raises(ValueError, match=message):
        registry_for_profile(make_profile(mcp_servers=[server]))


def test_duplicate_mcp_server_names_are_refused():
    servers = [{"name": "s", "command": "a"}, {"name": "s", "command": "b"}]
    with pytest.raises(ValueError, match="two MCP servers"):
        registry_for_profile(make_profile(mcp_servers=servers))


def test_registry_is_cached_until_the_profile_changes():
    profile = make_profile(builtin_tools=["clock.now"])
    first = registry_for_profile(profile)
    assert registry_for_profile(profile) is first
    assert registry_for_profile(AgentProfile.objects.get(pk=profile.pk)) is first

    profile.builtin_tools = ["clock.now", "workspace.list"]
    profile.save()
    second = registry_for_profile(AgentProfile.objects.get(pk=profile.pk))
    assert second is not first
    assert second.names() == ["clock.now", "workspace.list"]

    profile.approvals = {"clock.now": "always"}
    profile.save()
    assert registry_for_profile(profile)["clock.now"].approval == "always"


def test_cache_is_per_profile():
    a = make_profile(name="a", builtin_tools=["clock.now"])
    b = make_profile(name="b", builtin_tools=["clock.now"])
    assert registry_for_profile(a) is not registry_for_profile(b)
    assert registry_for_profile(a) is registry_for_profile(a)


def test_unavailable_mcp_server_degrades_and_is_not_cached():
    servers = [{"name": "broken", "command": sys.executable, "args": ["-c", "raise SystemExit(3)"]}]
    profile = make_profile(builtin_tools=["clock.now"], mcp_servers=servers)
    reg = registry_for_profile(profile)
    assert reg.degraded is True
    assert reg.names() == ["clock.now"]
    # Named with why, for a turn that owes a call to one of its tools (runtime/definitions.py).
    assert list(reg.unavailable) == ["broken"] and "could not start" in reg.unavailable["broken"]
    assert registry_for_profile(profile) is not reg
    with pytest.raises(mcp.MCPUnavailable):
        build_registry([], servers)


def test_registry_is_immutable_and_rejects_duplicates():
    reg = Registry([BUILTINS["clock.now"]])
    with pytest.raises(TypeError):
        reg["x"] = BUILTINS["debug.noop"]  # type: ignore[index]
    with pytest.raises(ValueError, match="duplicate"):
        Registry([BUILTINS["clock.now"], BUILTINS["clock.now"]])
    assert repr(reg) == "Registry(['clock.now'])"


def test_a_registry_without_mcp_servers_never_imports_the_sdk() -> None:
    import subprocess

    code = (
        "import django, sys; django.setup()\n"
        "from sessions_app.tools.registry import build_registry\n"
        "assert build_registry(['clock.now']).names() == ['clock.now']\n"
        "assert 'mcp' not in sys.modules and 'sessions_app.tools.mcp' not in sys.modules, 'imported'\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "terret_site.settings"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
