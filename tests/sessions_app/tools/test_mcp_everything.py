"""Terret's MCP client against the reference servers: server-everything over
stdio and over Streamable HTTP (behind a bearer-token gate, the token from
the environment), server-filesystem, and mcp-server-git for a mutating tool.
Everything is counted where it happens: at the gate, in the repository."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from sessions_app.llm.types import ToolText
from sessions_app.runtime.profiles import check_profile
from sessions_app.tools import mcp, registry
from sessions_app.tools.base import ToolContext, ToolError
from sessions_app.tools.executor import execute
from tests.sessions_app.tools.conftest import TOKEN_VAR, AuthProxy, EverythingHttp, http_config

# server-everything's annotations, and what Terret makes of them (docs/tools.md).
EXPECTED_POLICIES = {
    "echo": ("never", "safe", False),  # readOnlyHint
    "get-tiny-image": ("never", "safe", False),
    "trigger-long-running-operation": ("never", "safe", False),
    "gzip-file-as-resource": ("policy", "safe", True),  # not read-only, idempotent
    "toggle-simulated-logging": ("policy", "never", True),  # not read-only, not idempotent
}


@pytest.fixture(params=["stdio", "http"])
def everything(request: pytest.FixtureRequest, everything_stdio: dict[str, Any]) -> dict[str, Any]:
    if request.param == "stdio":
        return everything_stdio
    return http_config(request.getfixturevalue("auth_proxy"), name="everything")


def by_name(config: dict[str, Any]) -> dict[str, Any]:
    return {d.name.rsplit(".", 1)[1]: d for d in mcp.list_tools(config)}


def test_annotations_map_to_approval_and_replay_over_both_transports(everything: dict[str, Any]) -> None:
    tools = by_name(everything)
    for name, (approval, replay, mutating) in EXPECTED_POLICIES.items():
        defn = tools[name]
        assert (defn.approval, defn.replay_policy, defn.mutating) == (approval, replay, mutating), name
    assert tools["echo"].name == "mcp.everything.echo"


def test_an_image_is_kept_as_an_attachment_and_named_in_the_text(everything: dict[str, Any]) -> None:
    result = mcp.call_tool(everything, "get-tiny-image", {})
    assert isinstance(result, ToolText)
    (image,) = result.attachments
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    assert image["data"].startswith("iVBORw0KGgo")  # a PNG, base64, whole
    assert "[image 1: image/png, " in result and image["data"] not in result


def test_progress_notifications_reach_the_reporter(everything: dict[str, Any]) -> None:
    seen: list[tuple[float, float | None, str | None]] = []
    text = mcp.call_tool(
        everything, "trigger-long-running-operation", {"duration": 1, "steps": 3}, on_progress=lambda *p: seen.append(p)
    )
    assert "Long running operation completed" in text
    assert [(p, t) for p, t, _ in seen] == [(1, 3), (2, 3), (3, 3)]


def test_structured_content_reaches_the_text(everything: dict[str, Any]) -> None:
    text = mcp.call_tool(everything, "get-structured-content", {"location": "Chicago"})
    assert '"temperature"' in text


def test_the_token_comes_from_the_environment_on_every_request(auth_proxy: AuthProxy) -> None:
    config = http_config(auth_proxy)
    assert "${" + TOKEN_VAR + "}" in str(config["headers"])  # the profile holds the name, not the secret
    assert mcp.call_tool(config, "echo", {"message": "hi"}) == "Echo: hi"
    assert auth_proxy.seen and set(auth_proxy.seen) == {f"Bearer {auth_proxy.token}"}
    assert auth_proxy.refused == 0


def test_a_missing_variable_is_a_configuration_error_naming_it(
    auth_proxy: AuthProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_VAR)
    config = http_config(auth_proxy, name="unset")
    with pytest.raises(mcp.MCPConfigError, match=f"'unset'.*{TOKEN_VAR}, which is not set"):
        registry.build_registry([], [config], strict=False)  # not swallowed as a server outage
    assert auth_proxy.seen == []  # nothing was sent without it


def test_a_wrong_token_is_refused_at_the_server(auth_proxy: AuthProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_VAR, "wrong")
    with pytest.raises(mcp.MCPUnavailable) as caught:
        mcp.list_tools(http_config(auth_proxy, name="wrong"))
    assert "wrong" not in str(caught.value).replace("'wrong'", "")  # the value is never in the message
    assert auth_proxy.refused >= 1


def test_a_restarted_http_server_is_reconnected(auth_proxy: AuthProxy, everything_http: EverythingHttp) -> None:
    config = http_config(auth_proxy, name="restarts")
    assert mcp.call_tool(config, "echo", {"message": "one"}) == "Echo: one"
    everything_http.stop()
    everything_http.start()  # same port: it has forgotten our MCP session
    with pytest.raises(ToolError):
        mcp.call_tool(config, "echo", {"message": "lost"})  # not retried: a call may have had its effect
    assert mcp.call_tool(config, "echo", {"message": "two"}) == "Echo: two"


# -- configuration ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        (
            {"name": "r", "url": "http://h/mcp", "headers": {"Authorization": "Bearer abc"}},
            "must come from the environment",
        ),
        ({"name": "r", "url": "http://h/mcp", "headers": {"X-Api-Key": "abc"}}, "must come from the environment"),
        ({"name": "r", "url": "http://h/mcp", "headers": {"X-Trace": "${BAD"}}, "malformed placeholder"),
        ({"name": "r", "url": "ftp://h/mcp"}, "http:// or https://"),
        ({"name": "r", "url": "http://user:pw@h/mcp"}, "not in the url"),
        ({"name": "r", "url": "http://h/mcp?api_key=abc"}, "not in the url"),
        ({"name": "r", "url": "http://h/mcp", "command": "x"}, "not both"),
        ({"name": "r", "url": "http://h/mcp", "env": {"A": "b"}}, "stdio server only"),
        ({"name": "r", "command": "x", "headers": {"A": "b"}}, "url server only"),
        ({"name": "r", "url": "http://h/mcp", "headers": {"Bad Name": "x"}}, "not a valid header name"),
    ],
)
def test_bad_remote_configurations_are_refused_with_the_reason(server: dict[str, Any], problem: str) -> None:
    problems = check_profile(roles={}, builtin_tools=[], mcp_servers=[server], approvals={})
    assert problem in " ".join(problems["mcp_servers"])


def test_a_good_remote_configuration_passes_the_profile_check() -> None:
    server = {
        "name": "remote",
        "url": "https://mcp.example.com/mcp",
        "headers": {"Authorization": "Bearer ${MCP_TOKEN}", "X-Team": "agents"},
        "timeout": 30,
    }
    assert check_profile(roles={}, builtin_tools=[], mcp_servers=[server], approvals={}, image_roles=["main"]) == {}
    assert "image_roles" in check_profile(roles={}, builtin_tools=[], mcp_servers=[], approvals={}, image_roles=["x"])


# -- server-filesystem and mcp-server-git -----------------------------------------


def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(uuid.uuid4(), "call-1", tmp_path, idempotency_key="terret:k", attempt=1)


def test_filesystem_server_reads_and_its_write_is_gated(filesystem_server: dict[str, Any], tmp_path: Path) -> None:
    root = Path(filesystem_server["args"][-1])
    (root / "note.txt").write_text("from the test\n")
    tools = by_name(filesystem_server)
    assert (tools["read_text_file"].approval, tools["read_text_file"].mutating) == ("never", False)
    assert (tools["write_file"].approval, tools["write_file"].mutating) == ("policy", True)
    read = execute(tools["read_text_file"], ctx(tmp_path), f'{{"path": "{root / "note.txt"}"}}')
    assert (read.is_error, read.content.strip()) == (False, "from the test")
    wrote = execute(tools["write_file"], ctx(tmp_path), f'{{"path": "{root / "new.txt"}", "content": "x"}}')
    assert not wrote.is_error and (root / "new.txt").read_text() == "x"
    outside = execute(tools["read_text_file"], ctx(tmp_path), '{"path": "/etc/hostname"}')
    assert outside.is_error  # the server's own sandbox


def commits(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], check=True, capture_output=True, text=True)
    return out.stdout.split("\n")[:-1]


def test_git_server_commit_is_a_mutating_tool_that_changes_the_repository(
    git_server: dict[str, Any], tmp_path: Path
) -> None:
    repo = Path(git_server["args"][-1])
    tools = by_name(git_server)
    assert tools["git_commit"].mutating and tools["git_commit"].approval == "policy"
    assert tools["git_commit"].replay_policy == "never"  # not idempotent: never re-run blindly
    (repo / "added.txt").write_text("more\n")
    add = execute(tools["git_add"], ctx(tmp_path), json.dumps({"repo_path": str(repo), "files": ["added.txt"]}))
    assert not add.is_error, add.content
    commit = execute(tools["git_commit"], ctx(tmp_path), json.dumps({"repo_path": str(repo), "message": "by terret"}))
    assert not commit.is_error, commit.content
    assert commits(repo) == ["by terret", "first"]
