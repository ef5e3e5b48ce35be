"""A workspace MCP server (server-filesystem with `"workspace": true`) on
two "hosts": real Celery worker processes with local directories of their
own (TERRET_WORKSPACE_ROOT=/a, /b) take turns on one session, as in
tests/sessions_app/runtime/test_multihost.py. What the server writes on a
is a document the agent reads on b; what the agent writes on b is read by
the server on a fresh host a. Counted at the target: the tool results, the
documents' versions and who wrote them, and the files each host's scratch
directory holds."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session
from tests.fakes.fake_llm import Reply
from tests.helpers import document_text, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def ended(session: Session) -> int:
    return Event.objects.filter(session=session, kind="turn/end", data__status="completed").count()


def scratch_files(root: Path) -> dict[str, str]:
    """The files of the host's scratch directories, by path under the directory."""
    return {
        str(p.relative_to(d)): p.read_text()
        for d in sorted(root.glob("terret-docs-*"))
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def test_a_workspace_servers_files_are_the_sessions_documents_on_every_host(
    start_worker: Any,
    fake_llm: Any,
    make_user: Any,
    settings: Any,
    tmp_path: Path,
    filesystem_workspace: dict[str, Any],
) -> None:
    host_a, host_b = tmp_path / "a", tmp_path / "b"
    host_a.mkdir()
    host_b.mkdir()
    settings.TERRET_WORKSPACE_ROOT = tmp_path / "test-process"  # neither host's
    profile = AgentProfile.objects.create(
        name="mcp-workspace",
        roles={"main": "test/model"},
        builtin_tools=["workspace.write", "workspace.read"],
        mcp_servers=[filesystem_workspace],
        allow_floor=["*"],
        approvals={"workspace.write": "never", "mcp.fs.write_file": "never"},
    )
    session = services.create_session(make_user(), profile)
    fake_llm.script(
        # turn 1, on a: the server writes a file
        Reply(tool_calls=[("mcp.fs.write_file", {"path": "notes.md", "content": "the server wrote this on a"})]),
        Reply(text="written"),
        # turn 2, on b: the agent reads it from the documents and writes another
        Reply(
            tool_calls=[
                ("workspace.read", {"path": "notes.md"}),
                ("workspace.write", {"path": "plan.md", "content": "the agent wrote this on b"}),
            ]
        ),
        Reply(text="read and answered"),
        # turn 3, on a fresh host a: the server reads what the agent wrote on b
        Reply(tool_calls=[("mcp.fs.read_text_file", {"path": "plan.md"})]),
        Reply(text="all there"),
    )

    a = start_worker(name="a", TERRET_WORKSPACE_ROOT=str(host_a))
    services.inject(session.id, "turn 1", wake=True)
    wait_for(lambda: ended(session) == 1, timeout=90, what="turn 1 on host a")
    assert scratch_files(host_a) == {"notes.md": "the server wrote this on a"}
    a.kill()  # host a is gone, and its disk with it
    shutil.rmtree(host_a)
    host_a.mkdir()

    b = start_worker(name="b", TERRET_WORKSPACE_ROOT=str(host_b))
    services.inject(session.id, "turn 2", wake=True)
    wait_for(lambda: ended(session) == 2, timeout=90, what="turn 2 on host b")
    assert scratch_files(host_b) == {}  # b's turn used no workspace server: nothing materialized
    b.kill()

    start_worker(name="a2", TERRET_WORKSPACE_ROOT=str(host_a))
    services.inject(session.id, "turn 3", wake=True)
    wait_for(lambda: ended(session) == 3, timeout=90, what="turn 3 on host a")

    rows = Event.objects.filter(session=session, kind="tool/result").order_by("seq")
    got = [(r["name"], r["content"], r["is_error"]) for r in rows.values_list("data", flat=True)]
    assert got == [
        ("mcp.fs.write_file", "Successfully wrote to notes.md", False),
        ("workspace.read", "the server wrote this on a", False),  # on b, what the server wrote on a
        ("workspace.write", "wrote 25 bytes to plan.md", False),
        ("mcp.fs.read_text_file", "the agent wrote this on b", False),  # on a again, what the agent wrote on b
    ]
    written = Event.objects.filter(session=session, kind="document/written").order_by("seq")
    assert [(d["name"], d["version"], d["by"]) for d in written.values_list("data", flat=True)] == [
        ("notes.md", 1, "mcp:fs"),
        ("plan.md", 1, "agent"),
    ]
    assert document_text(session.id, "notes.md") == "the server wrote this on a"
    # the new host a's server works in a fresh copy of the documents, not the old one's disk
    assert scratch_files(host_a) == {"notes.md": "the server wrote this on a", "plan.md": "the agent wrote this on b"}
    assert len(fake_llm.requests) == 6
