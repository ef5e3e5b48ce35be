"""Documents (runtime/documents.py): versions logged as document/written,
content stored once by hash, incarnations, bounds, typed json with
read-only and committed migrations, task scope, fork inheritance by scope,
and the materialized directory (runtime/materialize.py). Each runs on the
embedded path (SQLite) and on PostgreSQL; the concurrent fork test needs
PostgreSQL's row locks between threads."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from sessions_app import log
from sessions_app.errors import (
    DocumentConflict,
    DocumentTooLarge,
    DocumentVersionUnsupported,
    InvalidInput,
    LeaseLost,
    UnknownDocument,
)
from sessions_app.models import DocumentContent, DocumentVersion, Event, Session
from sessions_app.runtime import documents, lease
from sessions_app.runtime.materialize import materialized, open_scratch
from sessions_app.services import forks
from tests.helpers import edit_profile, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


def written(session: Session) -> list[dict[str, Any]]:
    rows = Event.objects.filter(session=session, kind="document/written").order_by("seq")
    return list(rows.values_list("data", flat=True))


def texts(session_id: Any, at_seq: int | None = None) -> dict[str, str]:
    return {
        i.name: documents.read(session_id, i.name, at_seq=at_seq).data.decode()
        for i in documents.listing(session_id, at_seq=at_seq)
    }


# ---------------------------------------------------------------- versions


def test_every_write_is_a_logged_version_and_content_is_deduplicated(session: Session) -> None:
    one = documents.write(session.id, "a.txt", b"same", by="alice")
    two = documents.write(session.id, "b/c.txt", b"same")
    three = documents.write(session.id, "a.txt", b"other")
    assert (one.version, three.version, one.incarnation) == (1, 2, 1)
    assert DocumentContent.objects.count() == 2  # "same" once, "other" once
    logged = written(session)
    assert [(d["name"], d["version"], d["size"]) for d in logged] == [
        ("a.txt", 1, 4),
        ("b/c.txt", 1, 4),
        ("a.txt", 2, 5),
    ]
    assert logged[0]["sha256"] == hashlib.sha256(b"same").hexdigest() and logged[0]["by"] == "alice"
    assert "same" not in json.dumps(logged)  # the log holds hashes, never content
    # each version's seq is its event's, and history stays readable
    assert DocumentVersion.objects.get(document__name="a.txt", version=2).seq == three.seq
    assert documents.read(session.id, "a.txt", version=1).data == b"same"
    assert documents.read(session.id, "a.txt", at_seq=two.seq).data == b"same"
    assert texts(session.id, at_seq=one.seq) == {"a.txt": "same"}
    with pytest.raises(UnknownDocument):
        documents.read(session.id, "a.txt", version=3)


def test_bounds_are_refused_with_clear_errors_and_write_nothing(session: Session, profile: Any) -> None:
    edit_profile(profile, max_document_bytes=10, max_session_document_bytes=15, max_documents=2)
    documents.write(session.id, "a", b"0123456789")
    before = Session.objects.get(id=session.id).last_seq
    with pytest.raises(DocumentTooLarge, match=r"a document's bound is 10 \(max_document_bytes\)"):
        documents.write(session.id, "b", b"0123456789X")
    with pytest.raises(DocumentTooLarge, match=r"would hold 16 bytes; the bound is 15"):
        documents.write(session.id, "b", b"012345")
    documents.write(session.id, "b", b"01234")
    with pytest.raises(DocumentTooLarge, match=r"holds 2 documents; the bound is 2 \(max_documents\)"):
        documents.write(session.id, "c", b"")
    documents.write(session.id, "a", b"0")  # replacing counts the new size, not both
    assert Session.objects.get(id=session.id).last_seq == before + 2
    assert DocumentTooLarge.status == 413 and DocumentTooLarge.code == "document_too_large"


def test_a_recreated_document_is_a_new_incarnation_old_handles_cannot_reach(session: Session) -> None:
    first = documents.write(session.id, "plan.md", b"v1")
    handle = documents.Handle(session.id, "plan.md", first.incarnation, first.version)
    documents.retire(session.id, "plan.md", by="alice")
    with pytest.raises(UnknownDocument):
        documents.read(session.id, "plan.md")
    again = documents.write(session.id, "plan.md", b"new life")
    assert (again.incarnation, again.version) == (2, 1)
    before = Session.objects.get(id=session.id).last_seq
    with pytest.raises(DocumentConflict, match="incarnation 1 is gone"):
        documents.write(session.id, "plan.md", b"through the old handle", expect=handle)
    with pytest.raises(DocumentConflict):
        documents.retire(session.id, "plan.md", expect=handle)
    stale = documents.Handle(session.id, "plan.md", 2, 0)
    with pytest.raises(DocumentConflict, match="written since"):
        documents.write(session.id, "plan.md", b"x", expect=stale)
    assert Session.objects.get(id=session.id).last_seq == before
    assert documents.read(session.id, "plan.md").data == b"new life"
    # the old incarnation's history is still there, as of its seqs
    assert documents.read(session.id, "plan.md", at_seq=first.seq).data == b"v1"


def test_paths_stay_a_tree_and_kinds_are_checked(session: Session) -> None:
    documents.write(session.id, "dir/a", b"")
    with pytest.raises(InvalidInput, match="is a directory"):
        documents.write(session.id, "dir", b"")
    with pytest.raises(InvalidInput, match="parent of the path is a file"):
        documents.write(session.id, "dir/a/b", b"")
    with pytest.raises(InvalidInput, match="kind"):
        documents.write(session.id, "x", b"", kind="NOT A KIND")
    with pytest.raises(InvalidInput, match="names its task"):
        documents.write(session.id, "x", b"", scope="task")
    with pytest.raises(InvalidInput, match="relative"):
        documents.write(session.id, "/etc/passwd", b"")
    with pytest.raises(InvalidInput, match="lone surrogates"):
        documents.write(session.id, "a\ud800", b"")
    # an unknown kind is kept as opaque bytes
    blob = documents.write(session.id, "model.bin", b"\x00\xff", kind="onnx")
    assert documents.read(session.id, "model.bin").data == b"\x00\xff" and blob.kind == "onnx"


# ---------------------------------------------------------------- typed json


def _plan_v1_to_v2(value: Any) -> Any:
    return {"steps": [{"text": s} for s in value["steps"]]}


PLAN = documents.Schema(
    "plan",
    2,
    {
        "type": "object",
        "properties": {"steps": {"type": "array", "items": {"type": "object", "required": ["text"]}}},
        "required": ["steps"],
    },
    {1: _plan_v1_to_v2},
)


@pytest.fixture
def plan_schema() -> Any:
    documents.register_schema(PLAN)
    yield PLAN
    documents._SCHEMAS.pop("plan", None)


def test_json_older_versions_migrate_on_read_without_rewriting_history(session: Session, plan_schema: Any) -> None:
    old = json.dumps({"steps": ["a", "b"]}).encode()
    documents.write(session.id, "plan.json", old, kind="json", schema="plan", schema_version=1)
    events_before = Session.objects.get(id=session.id).last_seq
    typed = documents.read_typed(session.id, "plan.json")
    assert typed.value == {"steps": [{"text": "a"}, {"text": "b"}]} and typed.migrated
    assert (typed.stored_version, typed.version) == (1, 2)
    # read-only migration: nothing written, the stored version untouched
    assert Session.objects.get(id=session.id).last_seq == events_before
    assert documents.read(session.id, "plan.json").data == old
    # committed write migration: a new version, marked as such
    info = documents.migrate(session.id, "plan.json", by="ops")
    assert (info.version, info.schema_version) == (2, 2)
    assert written(session)[-1]["migrated_from"] == 1 and written(session)[-1]["schema_version"] == 2
    assert documents.read(session.id, "plan.json", version=1).data == old  # history kept
    assert not documents.read_typed(session.id, "plan.json").migrated
    # a write in the current version is checked against the schema
    with pytest.raises(InvalidInput, match="does not match plan version 2"):
        documents.write(session.id, "plan.json", b'{"steps": ["not an object"]}')
    with pytest.raises(InvalidInput, match="must be JSON"):
        documents.write(session.id, "plan.json", b"{")


def test_json_newer_or_unmigratable_versions_fail_visibly(session: Session, plan_schema: Any) -> None:
    with pytest.raises(DocumentVersionUnsupported, match="newer than this code's"):
        documents.write(session.id, "n.json", b"{}", kind="json", schema="plan", schema_version=3)
    documents.write(session.id, "old.json", b'{"steps": []}', kind="json", schema="plan", schema_version=1)
    documents.write(session.id, "new.json", b'{"steps": []}', kind="json", schema="plan")  # at version 2
    documents.register_schema(documents.Schema("plan", 3, PLAN.schema, {2: lambda v: v}))  # no step 1 -> 2
    with pytest.raises(DocumentVersionUnsupported, match="no migration from version 1 to 2"):
        documents.read_typed(session.id, "old.json")
    assert documents.read_typed(session.id, "new.json").migrated
    documents.register_schema(documents.Schema("plan", 1, {"type": "object"}))  # a rollback to older code
    with pytest.raises(DocumentVersionUnsupported, match="reads up to version 1"):
        documents.read_typed(session.id, "new.json")
    # the untyped read still answers: the bytes are kept as they were
    assert documents.read(session.id, "new.json").data == b'{"steps": []}'
    assert DocumentVersionUnsupported.status == 422


# ---------------------------------------------------------------- scopes and forks


def test_task_documents_retire_with_their_task_and_are_never_forked(session: Session, owner: Any) -> None:
    documents.write(session.id, "scratch/t1.log", b"task", scope="task", task="t1")
    documents.write(session.id, "notes.md", b"conversation")
    documents.write(session.id, "prefs.json", b"{}", kind="json", scope="session")
    child = forks.fork(session.id, Session.objects.get(id=session.id).last_seq, "current", user=owner)
    assert sorted(texts(child.id)) == ["notes.md", "prefs.json"]
    assert documents.retire_task(session.id, "t1") == ["scratch/t1.log"]
    assert sorted(texts(session.id)) == ["notes.md", "prefs.json"]
    assert Event.objects.filter(session=session, kind="document/retired", data__reason="task_ended").count() == 1


def test_a_historical_fork_sees_conversation_documents_as_of_its_point_and_session_ones_now(
    session: Session, owner: Any
) -> None:
    documents.write(session.id, "a.txt", b"one")
    documents.write(session.id, "prefs", b"dark", scope="session")
    point = Session.objects.get(id=session.id).last_seq
    documents.write(session.id, "a.txt", b"two")
    documents.write(session.id, "b.txt", b"later")
    documents.write(session.id, "prefs", b"light")
    historical = forks.fork(session.id, point, "historical", user=owner)
    assert texts(historical.id) == {"a.txt": "one", "prefs": "light"}
    current = forks.fork(session.id, point, "current", user=owner)
    assert texts(current.id) == {"a.txt": "two", "b.txt": "later", "prefs": "light"}
    assert texts(forks.fork(session.id, point, "fresh", user=owner).id) == {}
    # the fork's versions carry its seed's seq; its own writes go on from the parent's number
    (a,) = [i for i in documents.listing(historical.id) if i.name == "a.txt"]
    assert (a.seq, a.version) == (1, 1)
    assert documents.write(historical.id, "a.txt", b"mine").version == 2
    assert texts(session.id)["a.txt"] == "two"  # the parent is untouched
    assert DocumentContent.objects.filter(sha256=hashlib.sha256(b"one").hexdigest()).count() == 1  # shared


@pytest.mark.postgres
def test_a_current_fork_sees_the_parents_documents_at_admission_exactly(session: Session, owner: Any) -> None:
    """A writer thread commits version after version while forks are made:
    each current fork holds exactly the version in force at its
    session/forked_to (the parent's row lock orders the copy among the
    writes), never one from before or after it."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's row locks between threads")
    documents.write(session.id, "counter", b"0")
    stop = threading.Event()

    def writer() -> None:
        n = 0
        try:
            while not stop.is_set():
                n += 1
                documents.write(session.id, "counter", str(n).encode())
        finally:
            connection.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        children = []
        for _ in range(8):
            seen_before = documents.read(session.id, "counter").info.version
            wait_for(lambda: documents.read(session.id, "counter").info.version > seen_before, what="a write")
            children.append(forks.fork(session.id, 1, "current", user=owner))
    finally:
        stop.set()
        thread.join(30)
    seen = set()
    for child in children:
        note = Event.objects.get(session=session, kind="session/forked_to", data__child=str(child.id))
        expected = documents.read(session.id, "counter", at_seq=note.seq).data
        assert documents.read(child.id, "counter").data == expected
        seen.add(expected)
    assert len(seen) > 1, "the writer ran between the forks"


# ---------------------------------------------------------------- materialize


def test_materialize_commits_what_a_program_changed(session: Session, tmp_path: Path) -> None:
    documents.write(session.id, "src/main.py", b"print(1)\n")
    documents.write(session.id, "old.txt", b"bye")
    documents.write(session.id, "keep.txt", b"same")
    with materialized(session.id, by="command", root=tmp_path) as scratch:
        assert (scratch.path / "src/main.py").read_bytes() == b"print(1)\n"
        (scratch.path / "src/main.py").write_text("print(2)\n")
        (scratch.path / "out").mkdir()
        (scratch.path / "out/result.txt").write_text("42")
        (scratch.path / "old.txt").unlink()
        (scratch.path / "link").symlink_to("/etc/passwd")
        where = scratch.path
    assert not where.exists()
    assert texts(session.id) == {"keep.txt": "same", "out/result.txt": "42", "src/main.py": "print(2)\n"}
    assert sorted(scratch.outcome.written) == ["out/result.txt", "src/main.py"]
    assert scratch.outcome.retired == ["old.txt"] and scratch.outcome.conflicts == []
    assert {d["name"]: d.get("by") for d in written(session)[-2:]} == {
        "out/result.txt": "command",
        "src/main.py": "command",
    }


def test_materialize_never_clobbers_a_write_made_meanwhile(session: Session, tmp_path: Path) -> None:
    documents.write(session.id, "a.txt", b"base")
    with materialized(session.id, root=tmp_path) as scratch:
        (scratch.path / "a.txt").write_text("program's")
        (scratch.path / "new.txt").write_text("program's")
        documents.write(session.id, "a.txt", b"someone else's")  # another turn, another host
        documents.write(session.id, "new.txt", b"someone else's")
        assert sorted(scratch.checkpoint().conflicts) == ["a.txt", "new.txt"]
    assert sorted(scratch.outcome.conflicts) == ["a.txt", "new.txt"]  # reported once
    assert scratch.outcome.written == []
    assert texts(session.id) == {"a.txt": "someone else's", "new.txt": "someone else's"}


def test_materialize_is_fenced_and_an_error_commits_nothing(session: Session, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), materialized(session.id, root=tmp_path) as scratch:
        (scratch.path / "half.txt").write_text("half done")
        raise RuntimeError("the command failed")
    assert texts(session.id) == {}
    held = lease.claim(session.id)
    assert held is not None
    try:
        stale = log.Fence(held.gen - 1, 30)
        with pytest.raises(LeaseLost), materialized(session.id, fence=stale, root=tmp_path) as scratch:
            (scratch.path / "late.txt").write_text("from a program that outlived its lease")
        assert texts(session.id) == {}
        with materialized(session.id, fence=held.fence, root=tmp_path) as scratch:
            (scratch.path / "ok.txt").write_text("fenced")
        assert texts(session.id) == {"ok.txt": "fenced"}
    finally:
        lease.keeper.drop(held)  # the keeper thread renews nothing after the test


def test_a_kept_scratch_directory_is_brought_to_the_heads(session: Session, tmp_path: Path) -> None:
    """refresh() (an MCP server's directory before each call): files are the heads, nothing else."""
    documents.write(session.id, "same.txt", b"same")
    documents.write(session.id, "edited.txt", b"old")
    documents.write(session.id, "gone.txt", b"gone")
    scratch = open_scratch(session.id, root=tmp_path)
    try:
        same = scratch.path / "same.txt"
        before = same.stat().st_mtime_ns
        (scratch.path / "stray.txt").write_text("never committed")
        (scratch.path / "outside").symlink_to(tmp_path)
        (scratch.path / "later").mkdir()  # a directory a program made: kept
        documents.write(session.id, "edited.txt", b"new")
        documents.retire(session.id, "gone.txt")
        documents.write(session.id, "made/new.txt", b"made elsewhere")
        scratch.refresh()
        found = {p.relative_to(scratch.path).as_posix() for p in scratch.path.rglob("*")}
        assert found == {"same.txt", "edited.txt", "made", "made/new.txt", "later"}
        assert (scratch.path / "edited.txt").read_bytes() == b"new"
        assert same.stat().st_mtime_ns == before  # an unchanged file is not rewritten
        assert sorted(scratch.base) == ["edited.txt", "made/new.txt", "same.txt"]
        assert scratch.checkpoint().written == []  # nothing to commit after a refresh
    finally:
        scratch.remove()
    assert not scratch.path.exists()


# ---------------------------------------------------------------- scratch directories of gone processes

HOLDER = """
import sys, time, uuid
import django
django.setup()
from sessions_app.runtime.materialize import open_scratch, scratch_root
from sessions_app.tools import documents
scratch = open_scratch(uuid.UUID(sys.argv[1]), root=scratch_root())
listing = documents.empty_directory("mcp-list")  # an MCP workspace server's listing (tools/mcp.py)
print(scratch.path, flush=True)
print(listing, flush=True)
time.sleep(600)
"""


def _holder(session: Session, root: Path) -> tuple[Any, Path, Path]:
    """A process of its own holding a scratch directory of `session` under
    `root`, and an empty one as its MCP manager lists a workspace server's tools in."""
    import subprocess
    import sys

    from tests.workers import ROOT, worker_env

    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(session.id)],
        cwd=ROOT,
        env=worker_env(TERRET_WORKSPACE_ROOT=str(root)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip()), Path(proc.stdout.readline().strip())


@pytest.mark.postgres  # the holders are processes of their own (tests/workers.py, worker_env)
def test_a_killed_processs_scratch_directories_are_swept_and_a_live_ones_are_not(
    session: Session, tmp_path: Path, settings: Any
) -> None:
    import os
    import signal

    from sessions_app.runtime.sweep import sweep_round

    settings.TERRET_WORKSPACE_ROOT = str(tmp_path)
    documents.write(session.id, "notes/a.txt", b"private")
    (dead, dead_dir, dead_list), (alive, alive_dir, alive_list) = _holder(session, tmp_path), _holder(session, tmp_path)
    own = open_scratch(session.id, root=tmp_path)  # this process's, alive too
    try:
        assert (dead_dir / "notes/a.txt").read_bytes() == b"private"
        assert dead_list.parent == tmp_path and dead_list.is_dir()
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait()
        sweep_round(at_start=False, wake=lambda sid: None)  # every worker's sweep, as it runs
        assert not dead_dir.exists()
        assert not dead_list.exists()
        assert alive_list.is_dir()
        assert (alive_dir / "notes/a.txt").read_bytes() == b"private"
        assert (own.path / "notes/a.txt").read_bytes() == b"private"
        owners = sorted(p.name for p in tmp_path.glob(".terret-owner-*"))
        assert len(owners) == 2, owners  # the dead process's lock file went with its directory

        alive.terminate()  # any exit frees the lock, not only kill -9
        alive.wait()
        sweep_round(at_start=False, wake=lambda sid: None)
        assert not alive_dir.exists()
        assert not alive_list.exists()
        assert own.path.exists()
    finally:
        for proc in (dead, alive):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        own.remove()


def test_the_clock_skips_mcp_workspaces_while_the_module_is_still_being_imported(monkeypatch: Any) -> None:
    """A worker's clock ticks while its warm-up thread imports tools/mcp.py
    (the MCP SDK: half a second): the module is in sys.modules before its
    functions are, and the tick closes nothing rather than failing."""
    import sys
    from types import ModuleType

    from sessions_app.runtime import materialize

    monkeypatch.setitem(sys.modules, "sessions_app.tools.mcp", ModuleType("sessions_app.tools.mcp"))
    assert materialize.close_idle_workspaces() == 0
    closed: list[int] = []
    done = ModuleType("sessions_app.tools.mcp")
    done.close_idle_workspaces = lambda: closed.append(1) or 2  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sessions_app.tools.mcp", done)
    assert materialize.close_idle_workspaces() == 2 and closed == [1]
