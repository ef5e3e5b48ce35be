"""Built-in tools, the workspace sandbox, and the executor."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sessions_app import services
from sessions_app.models import Document, DocumentContent, Event
from sessions_app.runtime import documents
from sessions_app.tools import builtins, executor
from sessions_app.tools.base import Definition, ToolContext, ToolError
from sessions_app.tools.builtins import BUILTINS, MAX_READ_BYTES, MAX_WRITE_BYTES
from sessions_app.tools.executor import MAX_RESULT_BYTES, ToolOutcome, execute
from tests.helpers import edit_profile


@pytest.fixture
def root(tmp_path: Path, settings) -> Path:
    settings.TERRET_WORKSPACE_ROOT = tmp_path / "workspaces"
    return settings.TERRET_WORKSPACE_ROOT


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspaces that nothing may touch."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret")
    return path


@pytest.fixture
def ctx(root: Path, session) -> ToolContext:
    return builtins.context_for(session.id, "call-1")


def run(name: str, ctx: ToolContext, **args) -> str:
    return BUILTINS[name].handler(ctx, args)


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file() and not p.is_symlink()}


# -- catalogue -----------------------------------------------------------------


def test_builtins_catalogue_and_flags():
    assert set(BUILTINS) == {
        "clock.now",
        "workspace.read",
        "workspace.write",
        "workspace.list",
        "debug.noop",
        "debug.sleep",
        "debug.charge",
        "schedule.create",
        "schedule.list",
        "schedule.cancel",
        "monitor.create",
        "monitor.list",
        "monitor.cancel",
        "task.start",
        "task.wait",
        "task.status",
        "task.cancel",
    }
    for name, defn in BUILTINS.items():
        assert defn.name == name
        assert defn.parameters["type"] == "object"
    write = BUILTINS["workspace.write"]
    assert (write.mutating, write.idempotent, write.approval) == (True, True, "policy")
    assert write.replay_policy == "reconcile" and write.reconcile is not None
    charge = BUILTINS["debug.charge"]
    assert (charge.mutating, charge.idempotent, charge.replay_policy) == (True, False, "never")
    # The agent's own wake-ups: making or cancelling one asks (approval policy),
    # and a re-run finds what its first attempt made (keyed on the call).
    for name in ("schedule.create", "schedule.cancel"):
        assert (BUILTINS[name].mutating, BUILTINS[name].approval, BUILTINS[name].replay_policy) == (
            True,
            "policy",
            "safe",
        )
    assert BUILTINS["schedule.list"].mutating is False
    # Owned work: starting or cancelling a task asks (approval policy); task.start and task.wait park the turn.
    for name in ("task.start", "task.cancel"):
        assert (BUILTINS[name].mutating, BUILTINS[name].approval) == (True, "policy")
    assert BUILTINS["task.start"].parks and BUILTINS["task.wait"].parks and not BUILTINS["task.status"].parks
    for name in ("clock.now", "workspace.read", "workspace.list", "debug.noop", "debug.sleep"):
        assert BUILTINS[name].mutating is False
        assert BUILTINS[name].approval == "never"
        assert BUILTINS[name].replay_policy == "safe"


def test_debug_charge_appends_one_line_per_execution(ctx):
    keyed = replace(ctx, idempotency_key="terret:s:3:c", attempt=2)
    assert run("debug.charge", keyed) == "charged (attempt 2, key terret:s:3:c)"
    run("debug.charge", keyed, seconds=0)
    lines = [json.loads(line) for line in (ctx.workspace / "charges.log").read_text().splitlines()]
    assert [(line["idempotency_key"], line["attempt"], line["call_id"]) for line in lines] == [
        ("terret:s:3:c", 2, ctx.call_id)
    ] * 2
    with pytest.raises(ToolError, match="seconds must be a number from 0 to 30"):
        run("debug.charge", keyed, seconds=31)


def test_workspace_write_reconciles_by_content_hash(ctx):
    write = BUILTINS["workspace.write"]
    assert write.reconcile is not None
    args = {"path": "notes/a.txt", "content": "hello"}
    assert write.reconcile(ctx, args).state == "not_done"  # nothing there yet
    run("workspace.write", ctx, **args)
    done = write.reconcile(ctx, args)
    assert (done.state, done.result) == ("done", "wrote 5 bytes to notes/a.txt")
    assert write.reconcile(ctx, {**args, "content": "hello!"}).state == "not_done"
    assert write.reconcile(ctx, {"path": "../escape", "content": "x"}).state == "not_done"


def test_clock_now_is_current_utc_iso8601(ctx):
    stamp = datetime.fromisoformat(run("clock.now", ctx))
    assert stamp.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - stamp) < timedelta(seconds=5)


def test_debug_noop(ctx):
    assert run("debug.noop", ctx) == "ok"


def test_debug_sleep_sleeps(ctx):
    started = time.monotonic()
    assert run("debug.sleep", ctx, seconds=0.2) == "slept 0.2"
    assert time.monotonic() - started >= 0.2
    assert run("debug.sleep", ctx, seconds=0) == "slept 0"


@pytest.mark.parametrize("seconds", [-1, 601, "5", True, None])
def test_debug_sleep_refuses_bad_durations(ctx, seconds):
    with pytest.raises(ToolError, match="seconds"):
        run("debug.sleep", ctx, seconds=seconds)


def test_debug_sleep_schema_caps_at_600(ctx):
    outcome = execute(BUILTINS["debug.sleep"], ctx, '{"seconds": 601}')
    assert outcome.is_error
    assert "seconds" in outcome.content


# -- workspace: the session's documents ----------------------------------------


def test_the_workspace_is_documents_not_a_directory(root, ctx):
    assert run("workspace.list", ctx) == "(workspace is empty)"
    run("workspace.write", ctx, path="notes/a.txt", content="x")
    assert not root.exists()  # nothing of the agent's world on this host's disk
    (info,) = documents.listing(ctx.session_id)
    assert (info.name, info.kind, info.scope, info.version, info.incarnation) == (
        "notes/a.txt",
        "file",
        "conversation",
        1,
        1,
    )
    written = Event.objects.filter(session_id=ctx.session_id, kind="document/written").values_list("data", flat=True)
    assert [(d["name"], d["version"], d["call_id"]) for d in written] == [("notes/a.txt", 1, "call-1")]


def test_write_read_roundtrip_with_nested_dirs(ctx):
    result = run("workspace.write", ctx, path="notes/day1/todo.md", content="héllo\n")
    assert result == "wrote 7 bytes to notes/day1/todo.md"
    assert documents.read(ctx.session_id, "notes/day1/todo.md").data == "héllo\n".encode()
    assert run("workspace.read", ctx, path="notes/day1/todo.md") == "héllo\n"
    assert run("workspace.read", ctx, path="./notes//day1/todo.md") == "héllo\n"


def test_every_write_is_a_version_and_content_is_stored_once(ctx):
    run("workspace.write", ctx, path="a.txt", content="one")
    run("workspace.write", ctx, path="a.txt", content="two")
    run("workspace.write", ctx, path="b.txt", content="two")
    assert run("workspace.read", ctx, path="a.txt") == "two"
    assert documents.read(ctx.session_id, "a.txt", version=1).data == b"one"
    assert [i.version for i in documents.listing(ctx.session_id)] == [2, 1]
    assert DocumentContent.objects.filter(sha256=hashlib.sha256(b"two").hexdigest()).count() == 1
    assert DocumentContent.objects.count() == 2


def test_list_shows_files_with_sizes(ctx):
    run("workspace.write", ctx, path="b.txt", content="12345")
    run("workspace.write", ctx, path="dir/a.txt", content="")
    assert run("workspace.list", ctx).splitlines() == ["b.txt (5 bytes)", "dir/a.txt (0 bytes)"]


def test_sessions_do_not_share_workspaces(ctx, owner, profile):
    other = services.create_session(owner, profile)
    second = builtins.context_for(other.id, "c2")
    run("workspace.write", ctx, path="mine.txt", content="first")
    with pytest.raises(ToolError, match="no such file"):
        run("workspace.read", second, path="mine.txt")
    assert run("workspace.list", second) == "(workspace is empty)"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/etc/passwd", "relative"),
        ("../outside/secret.txt", r"'\.\.'"),
        ("a/../../outside/secret.txt", r"'\.\.'"),
        ("a/../b.txt", r"'\.\.'"),
        ("..", r"'\.\.'"),
        ("x\x00y", "NUL"),
        ("", "non-empty"),
        ("   ", "non-empty"),
        (".", "name a file"),
        ("a" * 2000, "longer than"),
    ],
)
@pytest.mark.parametrize("tool", ["workspace.read", "workspace.write"])
def test_path_escapes_are_refused(ctx, outside, root, tool, path, message):
    before = snapshot(outside)
    with pytest.raises(ToolError, match=message):
        run(tool, ctx, path=path, content="pwned")
    assert snapshot(outside) == before
    assert not Document.objects.filter(session_id=ctx.session_id).exists()


@pytest.mark.parametrize("tool", ["workspace.read", "workspace.write"])
def test_non_string_paths_are_refused(ctx, tool):
    with pytest.raises(ToolError, match="non-empty string"):
        run(tool, ctx, path=["a"], content="x")


def test_read_size_limit(ctx):
    documents.write(ctx.session_id, "ok.txt", b"a" * MAX_READ_BYTES)
    documents.write(ctx.session_id, "big.txt", b"a" * (MAX_READ_BYTES + 1))
    assert len(run("workspace.read", ctx, path="ok.txt")) == MAX_READ_BYTES
    with pytest.raises(ToolError, match="read limit"):
        run("workspace.read", ctx, path="big.txt")


def test_write_size_limit_counts_utf8_bytes(ctx):
    run("workspace.write", ctx, path="ok.txt", content="a" * MAX_WRITE_BYTES)
    # Two bytes per character: under the limit in characters, over it in bytes.
    with pytest.raises(ToolError, match="write limit"):
        run("workspace.write", ctx, path="big.txt", content="é" * (MAX_WRITE_BYTES // 2 + 1))
    assert [i.name for i in documents.listing(ctx.session_id)] == ["ok.txt"]


def test_read_refuses_missing_and_binary(ctx):
    documents.write(ctx.session_id, "bin", b"\xff\xfe\x00")
    with pytest.raises(ToolError, match="no such file"):
        run("workspace.read", ctx, path="missing.txt")
    with pytest.raises(ToolError, match="not UTF-8"):
        run("workspace.read", ctx, path="bin")


def test_write_refuses_directories_and_file_parents(ctx):
    run("workspace.write", ctx, path="file.txt", content="x")
    run("workspace.write", ctx, path="dir/inner.txt", content="y")
    with pytest.raises(ToolError, match="directory"):
        run("workspace.write", ctx, path="dir", content="x")
    with pytest.raises(ToolError, match="parent"):
        run("workspace.write", ctx, path="file.txt/child.txt", content="x")
    assert run("workspace.read", ctx, path="file.txt") == "x"
    assert Event.objects.filter(session_id=ctx.session_id, kind="document/written").count() == 2


def test_write_refuses_non_string_content(ctx):
    with pytest.raises(ToolError, match="content"):
        run("workspace.write", ctx, path="a.txt", content=5)


def test_a_profile_bound_is_the_tools_error_and_nothing_is_written(ctx, profile):
    edit_profile(profile, max_document_bytes=4, max_session_document_bytes=6)
    with pytest.raises(ToolError, match="max_document_bytes"):
        run("workspace.write", ctx, path="a.txt", content="12345")
    run("workspace.write", ctx, path="a.txt", content="1234")
    with pytest.raises(ToolError, match="max_session_document_bytes"):
        run("workspace.write", ctx, path="b.txt", content="123")
    assert [(i.name, i.size) for i in documents.listing(ctx.session_id)] == [("a.txt", 4)]


# -- executor ----------------------------------------------------------------


def defn(handler, parameters=None, name="test.tool") -> Definition:
    schema = parameters or {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0}},
        "required": ["n"],
        "additionalProperties": False,
    }
    return Definition(name, "a test tool", schema, handler)


def test_execute_success(ctx):
    outcome = execute(defn(lambda c, a: f"n={a['n']} call={c.call_id}"), ctx, '{"n": 3}')
    assert outcome == ToolOutcome("n=3 call=call-1", False)


def test_execute_builtin_end_to_end(ctx):
    assert execute(BUILTINS["workspace.write"], ctx, json.dumps({"path": "x.txt", "content": "hi"})).is_error is False
    assert execute(BUILTINS["workspace.read"], ctx, '{"path": "x.txt"}') == ToolOutcome("hi", False)
    assert execute(BUILTINS["debug.noop"], ctx, "") == ToolOutcome("ok", False)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('{"n": ', "not valid JSON"),
        ("{'n': 1}", "not valid JSON"),
        ("[1, 2]", "JSON object, not list"),
        ('"text"', "JSON object, not str"),
    ],
)
def test_execute_bad_json_is_an_error_outcome(ctx, arguments, message):
    called = []
    outcome = execute(defn(lambda c, a: called.append(a) or "ran"), ctx, arguments)
    assert outcome.is_error
    assert message in outcome.content
    assert called == []


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        ("{}", ["invalid arguments for test.tool", '"n" is a required property']),
        ('{"n": "three"}', ["n:", "not of type"]),
        ('{"n": -1}', ["n:", "minimum"]),
        ('{"n": 1, "extra": true}', ["(root)", "extra"]),
    ],
)
def test_execute_schema_violation_is_explained(ctx, arguments, fragments):
    called = []
    outcome = execute(defn(lambda c, a: called.append(a) or "ran"), ctx, arguments)
    assert outcome.is_error
    for fragment in fragments:
        assert fragment in outcome.content
    assert called == []


def test_execute_schema_errors_are_bounded(ctx):
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdef"}}
    outcome = execute(defn(lambda c, a: "ran", schema), ctx, json.dumps({k: "x" * 5000 for k in "abcdef"}))
    assert outcome.is_error
    assert outcome.content.count("not of type") == 3
    assert len(outcome.content) < 1500


def test_execute_tool_error_reaches_the_model(ctx):
    def handler(c, a):
        raise ToolError("the disk is on fire")

    assert execute(defn(handler), ctx, '{"n": 1}') == ToolOutcome("the disk is on fire", True)


def test_execute_unexpected_exception_is_logged_and_kept_short(ctx, caplog):
    def handler(c, a):
        raise KeyError("password=hunter2")

    with caplog.at_level(logging.ERROR, logger="sessions_app.tools.executor"):
        outcome = execute(defn(handler), ctx, '{"n": 1}')
    assert outcome == ToolOutcome("internal error in test.tool (KeyError)", True)
    assert "hunter2" not in outcome.content
    [record] = caplog.records
    assert record.exc_info is not None
    assert "test.tool" in record.getMessage()


def test_execute_non_string_result_is_an_internal_error(ctx):
    outcome = execute(defn(lambda c, a: {"n": a["n"]}), ctx, '{"n": 1}')
    assert outcome == ToolOutcome("internal error in test.tool (TypeError)", True)


def test_execute_truncates_large_results(ctx):
    outcome = execute(defn(lambda c, a: "é" * MAX_RESULT_BYTES), ctx, '{"n": 1}')
    assert not outcome.is_error
    body, _, note = outcome.content.rpartition("\n")
    assert len(body.encode()) <= MAX_RESULT_BYTES
    assert set(body) == {"é"}  # cut on a character boundary
    assert note.startswith("[truncated:") and str(2 * MAX_RESULT_BYTES) in note


def test_execute_truncates_large_errors_too(ctx):
    def handler(c, a):
        raise ToolError("x" * (MAX_RESULT_BYTES * 2))

    outcome = execute(defn(handler), ctx, '{"n": 1}')
    assert outcome.is_error
    assert "[truncated:" in outcome.content
    assert len(outcome.content.encode()) < MAX_RESULT_BYTES + 200


def test_execute_result_at_the_limit_is_untouched(ctx):
    outcome = execute(defn(lambda c, a: "a" * MAX_RESULT_BYTES), ctx, '{"n": 1}')
    assert outcome.content == "a" * MAX_RESULT_BYTES


def test_execute_invalid_schema_is_an_error_outcome(ctx):
    outcome = execute(defn(lambda c, a: "ran", {"type": "bogus"}), ctx, "{}")
    assert outcome.is_error
    assert "schema is invalid" in outcome.content


def test_execute_does_not_fetch_remote_refs(ctx):
    schema = {"$ref": "http://127.0.0.1:9/schema.json"}
    started = time.monotonic()
    outcome = execute(defn(lambda c, a: "ran", schema), ctx, "{}")
    assert outcome.is_error
    assert time.monotonic() - started < 2


def test_execute_empty_arguments_mean_no_arguments(ctx):
    assert execute(defn(lambda c, a: json.dumps(a), {"type": "object"}), ctx, "  ") == ToolOutcome("{}", False)
    assert executor.MAX_ARGUMENT_CHARS > 0
