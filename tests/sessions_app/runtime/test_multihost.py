"""The multi-host drill (issue 33): real Celery worker processes, each with
a local directory of its own (TERRET_WORKSPACE_ROOT=/a, /b), take turns on
one session. What the agent writes in a turn on one host is what it reads
in the next turn on the other: the workspace is the session's documents,
in the database, and no host's disk holds any of it."""

from __future__ import annotations

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


def results(session: Session) -> list[dict[str, Any]]:
    rows = Event.objects.filter(session=session, kind="tool/result").order_by("seq")
    return list(rows.values_list("data", flat=True))


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_two_hosts_with_different_directories_take_turns_on_one_session(
    start_worker: Any, fake_llm: Any, make_user: Any, settings: Any, tmp_path: Path
) -> None:
    host_a, host_b = tmp_path / "a", tmp_path / "b"
    host_a.mkdir()
    host_b.mkdir()
    settings.TERRET_WORKSPACE_ROOT = tmp_path / "test-process"  # neither host's
    profile = AgentProfile.objects.create(
        name="multihost",
        roles={"main": "test/model"},
        builtin_tools=["workspace.write", "workspace.read", "workspace.list"],
        allow_floor=["*"],
        approvals={"workspace.write": "never"},
    )
    session = services.create_session(make_user(), profile)
    fake_llm.script(
        # turn 1, on /a: write a file
        Reply(tool_calls=[("workspace.write", {"path": "notes/plan.md", "content": "written on a"})]),
        Reply(text="written"),
        # turn 2, on /b: read it, and write another
        Reply(
            tool_calls=[
                ("workspace.read", {"path": "notes/plan.md"}),
                ("workspace.write", {"path": "notes/reply.md", "content": "written on b"}),
            ]
        ),
        Reply(text="read and answered"),
        # turn 3, on /a again: read what b wrote, and list
        Reply(tool_calls=[("workspace.read", {"path": "notes/reply.md"}), ("workspace.list", {})]),
        Reply(text="all there"),
    )

    a = start_worker(name="a", TERRET_WORKSPACE_ROOT=str(host_a))
    services.inject(session.id, "turn 1", wake=True)
    wait_for(lambda: ended(session) == 1, timeout=60, what="turn 1 on host a")
    a.kill()  # host a is gone: nothing of it can serve turn 2

    b = start_worker(name="b", TERRET_WORKSPACE_ROOT=str(host_b))
    services.inject(session.id, "turn 2", wake=True)
    wait_for(lambda: ended(session) == 2, timeout=60, what="turn 2 on host b")
    b.kill()

    start_worker(name="a2", TERRET_WORKSPACE_ROOT=str(host_a))
    services.inject(session.id, "turn 3", wake=True)
    wait_for(lambda: ended(session) == 3, timeout=60, what="turn 3 on host a")

    got = [(r["name"], r["content"], r["is_error"]) for r in results(session)]
    assert got == [
        ("workspace.write", "wrote 12 bytes to notes/plan.md", False),
        ("workspace.read", "written on a", False),  # on b, what a wrote
        ("workspace.write", "wrote 12 bytes to notes/reply.md", False),
        ("workspace.read", "written on b", False),  # on a, what b wrote
        ("workspace.list", "notes/plan.md (12 bytes)\nnotes/reply.md (12 bytes)", False),
    ]
    # each write is one committed version, fenced on the lease of the worker that ran it
    written = list(Event.objects.filter(session=session, kind="document/written").values_list("data", flat=True))
    assert [(d["name"], d["version"], d["by"]) for d in written] == [
        ("notes/plan.md", 1, "agent"),
        ("notes/reply.md", 1, "agent"),
    ]
    assert document_text(session.id, "notes/reply.md") == "written on b"
    # and neither host's disk holds any of the agent's world
    assert files_under(host_a) == [] and files_under(host_b) == []
    assert len(fake_llm.requests) == 6
