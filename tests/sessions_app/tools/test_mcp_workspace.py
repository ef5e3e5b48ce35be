"""An MCP server with `"workspace": true` works in the session's documents
(tools/mcp.py, runtime/materialize.py, docs/documents.md), with the real
@modelcontextprotocol/server-filesystem (node) as the server.

Each test calls the registry's definitions the way the turn runner does (a
ToolContext carrying the session and the lease generation) and counts at
the target: the files in the session's scratch directory on disk, and the
documents' versions and retirements in the log. These run on the embedded
path (SQLite) and on PostgreSQL alike; test_mcp_workspace_hosts.py runs the
same server in real worker processes on two "hosts"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessions_app.errors import LeaseLost
from sessions_app.models import Event, Session
from sessions_app.runtime import documents, lease
from sessions_app.runtime.materialize import owner_token
from sessions_app.runtime.profiles import check_profile
from sessions_app.tools import mcp
from sessions_app.tools.base import ToolContext, ToolError
from sessions_app.tools.registry import Registry, build_registry
from tests.helpers import document_text, edit_profile
from tests.sessions_app.tools.conftest import filesystem_workspace_config

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def fresh_servers(settings: Any, tmp_path: Path) -> Iterator[None]:
    """Each test starts and ends with no server and no workspace directory in
    this process, whose host root (TERRET_WORKSPACE_ROOT) is the test's own."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    mcp.shutdown()
    yield
    mcp.shutdown()


@pytest.fixture
def tools(filesystem_workspace: dict[str, Any]) -> Registry:
    return build_registry([], [filesystem_workspace])


@pytest.fixture
def held(session: Session) -> Iterator[lease.Lease]:
    """The session's lease, as a worker running its turn holds it."""
    got = lease.claim(session.id)
    assert got is not None
    yield got
    lease.keeper.drop(got)


def call(tools: Registry, session: Any, gen: int, tool: str, **args: Any) -> str:
    ctx = ToolContext(session.id, f"call-{tool}", Path("/nonexistent"), fence=gen)
    return tools[f"mcp.fs.{tool}"].handler(ctx, args)


def on_disk(session: Session) -> dict[str, str]:
    """The files of the session's one workspace directory in this process."""
    (where,) = mcp.manager().workspace_dirs(session.id)
    return {p.relative_to(where).as_posix(): p.read_text() for p in sorted(where.rglob("*")) if p.is_file()}


def logged(session: Session) -> list[tuple[str, str, int | None, str]]:
    rows = Event.objects.filter(session=session, kind__in=["document/written", "document/retired"]).order_by("seq")
    return [(e.kind, e.data["name"], e.data.get("version"), e.data.get("by", "")) for e in rows]


def test_the_servers_writes_are_documents_and_documents_reach_the_server(
    tools: Registry, session: Session, held: lease.Lease, tmp_path: Path
) -> None:
    call(tools, session, held.gen, "create_directory", path="notes")
    said = call(tools, session, held.gen, "write_file", path="notes/plan.md", content="from the server")
    assert "Successfully wrote" in said
    assert document_text(session.id, "notes/plan.md") == "from the server"
    assert on_disk(session) == {"notes/plan.md": "from the server"}
    (where,) = mcp.manager().workspace_dirs(session.id)
    assert where.parent == tmp_path  # under this host's TERRET_WORKSPACE_ROOT

    # Another host (or workspace.write) writes meanwhile: the next call sees it.
    documents.write(session.id, "notes/plan.md", b"edited elsewhere", by="agent")
    documents.write(session.id, "extra.txt", b"new elsewhere", by="agent")
    assert call(tools, session, held.gen, "read_text_file", path="notes/plan.md") == "edited elsewhere"
    assert call(tools, session, held.gen, "read_text_file", path="extra.txt") == "new elsewhere"
    assert on_disk(session) == {"extra.txt": "new elsewhere", "notes/plan.md": "edited elsewhere"}

    # A read committed nothing; each write is one version, by whom it says.
    assert logged(session) == [
        ("document/written", "notes/plan.md", 1, "mcp:fs"),
        ("document/written", "notes/plan.md", 2, "agent"),
        ("document/written", "extra.txt", 1, "agent"),
    ]


def test_two_sessions_never_see_each_others_files(
    tools: Registry, session: Session, profile: Any, owner: Any, held: lease.Lease, tmp_path: Path
) -> None:
    from sessions_app import services

    other = services.create_session(owner, profile)
    other_lease = lease.claim(other.id)
    assert other_lease is not None
    try:
        call(tools, session, held.gen, "write_file", path="secret.txt", content="session one's")
        listed = call(tools, other, other_lease.gen, "list_directory", path=".")
        assert "secret.txt" not in listed
        (mine,) = mcp.manager().workspace_dirs(session.id)
        (theirs,) = mcp.manager().workspace_dirs(other.id)
        assert mine != theirs
        with pytest.raises(ToolError, match="Access denied"):
            call(tools, other, other_lease.gen, "read_text_file", path=str(mine / "secret.txt"))
        call(tools, other, other_lease.gen, "write_file", path="secret.txt", content="session two's")
        assert document_text(session.id, "secret.txt") == "session one's"
        assert document_text(other.id, "secret.txt") == "session two's"
        assert on_disk(session) == {"secret.txt": "session one's"}
        assert on_disk(other) == {"secret.txt": "session two's"}
        # one server process per session, each run in its own directory
        running = {k.cwd for k in mcp.manager()._connections if isinstance(k, mcp.ServerKey)}
        listing = mcp.manager()._listing_dir
        assert running - {""} == {str(mine), str(theirs), str(listing)}
        # the listing's directory is this process's under the host's root, swept like the rest if it dies
        assert listing is not None and listing.parent == mine.parent == tmp_path
        assert listing.name.startswith(f"terret-docs-mcp-list-{owner_token(tmp_path)}-")
    finally:
        lease.keeper.drop(other_lease)


def test_a_file_the_server_removes_retires_its_document(tools: Registry, session: Session, held: lease.Lease) -> None:
    documents.write(session.id, "draft.txt", b"first draft", by="agent")
    # server-filesystem has no delete: a move removes the old name
    call(tools, session, held.gen, "move_file", source="draft.txt", destination="final.txt")
    assert document_text(session.id, "draft.txt") is None
    assert document_text(session.id, "final.txt") == "first draft"
    assert on_disk(session) == {"final.txt": "first draft"}
    assert logged(session) == [
        ("document/written", "draft.txt", 1, "agent"),
        ("document/written", "final.txt", 1, "mcp:fs"),
        ("document/retired", "draft.txt", None, "mcp:fs"),
    ]
    # and a document retired elsewhere leaves the directory before the next call
    documents.retire(session.id, "final.txt", by="agent")
    assert "final.txt" not in call(tools, session, held.gen, "list_directory", path=".")
    assert on_disk(session) == {}


def test_a_lost_lease_commits_nothing_and_its_leftovers_are_gone_next_call(tools: Registry, session: Session) -> None:
    before = lease.claim(session.id)  # a worker that lost the session (released here, as a takeover would)
    assert before is not None
    lease.release(before)
    held = lease.claim(session.id)
    assert held is not None and held.gen > before.gen
    with pytest.raises(LeaseLost):
        call(tools, session, before.gen, "write_file", path="late.txt", content="from a lost lease")
    assert on_disk(session) == {"late.txt": "from a lost lease"}  # the server did write it
    assert logged(session) == []  # nothing committed
    # The holder's next call starts from the documents' heads: the leftover is gone.
    assert "late.txt" not in call(tools, session, held.gen, "list_directory", path=".")
    assert on_disk(session) == {}
    assert logged(session) == []
    lease.keeper.drop(held)


def test_a_file_past_a_bound_is_an_error_that_names_it(
    tools: Registry, session: Session, profile: Any, held: lease.Lease
) -> None:
    edit_profile(profile, max_document_bytes=100)
    with pytest.raises(ToolError) as refused:
        call(tools, session, held.gen, "write_file", path="big.txt", content="x" * 500)
    said = str(refused.value)
    assert said.startswith("Successfully wrote")  # what the server said, then what was not kept
    assert "big.txt was not saved: big.txt would be 500 bytes" in said and "max_document_bytes" in said
    assert logged(session) == []
    call(tools, session, held.gen, "write_file", path="small.txt", content="fits")
    assert on_disk(session) == {"small.txt": "fits"}  # the refused file was not left to be refused again
    assert logged(session) == [("document/written", "small.txt", 1, "mcp:fs")]


def test_a_workspace_server_is_called_only_for_a_session(filesystem_workspace: dict[str, Any]) -> None:
    # A monitor's MCP source, say, has no session: no shared directory to fall back on.
    with pytest.raises(ToolError, match="works in a session's documents"):
        mcp.call_tool(filesystem_workspace, "list_directory", {"path": "."})


def test_the_workspace_setting_is_checked_when_the_profile_is_saved() -> None:
    fs = filesystem_workspace_config()

    def problems(server: dict[str, Any]) -> list[str]:
        return check_profile(
            roles={"main": "test/model"},
            builtin_tools=[],
            mcp_servers=[server],
            approvals={},
            context_windows={},
            image_roles=[],
        ).get("mcp_servers", [])

    assert problems(fs) == []
    assert problems({**fs, "workspace": "yes"}) == ["MCP server 'fs': workspace must be true or false"]
    assert problems({**fs, "workspace": False}) == [
        "MCP server 'fs': its args or env name {workspace}, which only a server with \"workspace\": true is given"
    ]
    remote = {"name": "fs", "url": "https://mcp.example.com/mcp", "workspace": True}
    assert problems(remote) == [
        "MCP server 'fs': workspace applies to a stdio server only (a process run beside the session's "
        "documents), not to a url"
    ]
    # the cwd alone is enough for a server that works in its current directory
    assert problems({"name": "x", "command": "some-server", "workspace": True}) == []


def test_past_the_bound_the_least_recently_used_workspace_is_closed(
    tools: Registry, session: Session, profile: Any, owner: Any, held: lease.Lease, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessions_app import services

    monkeypatch.setattr(mcp, "MAX_WORKSPACES", 1)
    call(tools, session, held.gen, "write_file", path="kept.txt", content="committed before the close")
    (first,) = mcp.manager().workspace_dirs(session.id)
    other = services.create_session(owner, profile)
    call(tools, other, 0, "list_directory", path=".")  # outside a turn: no fence
    assert mcp.manager().workspace_dirs(session.id) == [] and not first.exists()
    running = {k.cwd for k in mcp.manager()._connections if isinstance(k, mcp.ServerKey)}
    assert str(first) not in running and len(running - {"", str(mcp.manager()._listing_dir)}) == 1
    # the next call makes it again, from the documents
    assert call(tools, session, held.gen, "read_text_file", path="kept.txt") == "committed before the close"
    (again,) = mcp.manager().workspace_dirs(session.id)
    assert again != first


def test_a_workspace_idle_too_long_is_closed_by_the_clock_without_another_call(
    tools: Registry, session: Session, held: lease.Lease, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session nobody calls again: the worker's clock (hooks.run_clocks, as
    the clock thread runs it) closes its server and removes its directory."""
    from sessions_app.runtime import hooks

    call(tools, session, held.gen, "write_file", path="kept.txt", content="committed before the close")
    (where,) = mcp.manager().workspace_dirs(session.id)
    hooks.run_clocks()
    assert mcp.manager().workspace_dirs(session.id) == [where] and where.exists()  # not idle long enough yet
    monkeypatch.setattr(mcp, "WORKSPACE_IDLE_SECONDS", 0.0)
    hooks.run_clocks()
    assert mcp.manager().workspace_dirs(session.id) == [] and not where.exists()
    running = {k.cwd for k in mcp.manager()._connections if isinstance(k, mcp.ServerKey)}
    assert str(where) not in running  # its server process closed too
    assert document_text(session.id, "kept.txt") == "committed before the close"
