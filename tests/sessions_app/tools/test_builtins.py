"""Built-in tools, the workspace sandbox, and the executor."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sessions_app.tools import builtins, executor
from sessions_app.tools.base import Definition, ToolContext, ToolError
from sessions_app.tools.builtins import BUILTINS, MAX_READ_BYTES, MAX_WRITE_BYTES
from sessions_app.tools.executor import MAX_RESULT_BYTES, ToolOutcome, execute


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
def ctx(root: Path) -> ToolContext:
    return builtins.context_for(uuid.uuid4(), "call-1")


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


# -- workspace ---------------------------------------------------------------


def test_workspace_is_created_on_demand_per_session(root, ctx):
    assert ctx.workspace == root / ctx.session_id.hex
    assert not ctx.workspace.exists()
    assert run("workspace.list", ctx) == "(workspace is empty)"
    assert ctx.workspace.is_dir()


def test_write_read_roundtrip_with_nested_dirs(ctx):
    result = run("workspace.write", ctx, path="notes/day1/todo.md", content="héllo\n")
    assert result == "wrote 7 bytes to notes/day1/todo.md"
    assert (ctx.workspace / "notes/day1/todo.md").read_text("utf-8") == "héllo\n"
    assert run("workspace.read", ctx, path="notes/day1/todo.md") == "héllo\n"
    assert run("workspace.read", ctx, path="./notes//day1/todo.md") == "héllo\n"


def test_write_replaces_and_is_idempotent(ctx):
    run("workspace.write", ctx, path="a.txt", content="one")
    run("workspace.write", ctx, path="a.txt", content="two")
    run("workspace.write", ctx, path="a.txt", content="two")
    assert run("workspace.read", ctx, path="a.txt") == "two"
    # The write-then-rename leaves no temporary files behind.
    assert sorted(p.name for p in ctx.workspace.iterdir()) == ["a.txt"]


def test_list_shows_files_with_sizes(ctx):
    run("workspace.write", ctx, path="b.txt", content="12345")
    run("workspace.write", ctx, path="dir/a.txt", content="")
    assert run("workspace.list", ctx).splitlines() == ["b.txt (5 bytes)", "dir/a.txt (0 bytes)"]


def test_sessions_do_not_share_workspaces(root):
    first = builtins.context_for(uuid.uuid4(), "c1")
    second = builtins.context_for(uuid.uuid4(), "c2")
    run("workspace.write", first, path="mine.txt", content="first")
    with pytest.raises(ToolError, match="no such file"):
        run("workspace.read", second, path="mine.txt")


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
    assert snapshot(root) == {}


@pytest.mark.parametrize("tool", ["workspace.read", "workspace.write"])
def test_non_string_paths_are_refused(ctx, tool):
    with pytest.raises(ToolError, match="non-empty string"):
        run(tool, ctx, path=["a"], content="x")


def test_absolute_path_inside_the_workspace_is_still_refused(ctx):
    ctx.workspace.mkdir(parents=True)
    with pytest.raises(ToolError, match="relative"):
        run("workspace.write", ctx, path=str(ctx.workspace / "a.txt"), content="x")
    assert not (ctx.workspace / "a.txt").exists()


def test_symlinked_file_pointing_outside_is_refused(ctx, outside):
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolError, match="escapes"):
        run("workspace.read", ctx, path="link.txt")
    with pytest.raises(ToolError, match="escapes"):
        run("workspace.write", ctx, path="link.txt", content="pwned")
    assert (outside / "secret.txt").read_text() == "top secret"


def test_symlinked_dir_pointing_outside_is_refused(ctx, outside):
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "out").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    with pytest.raises(ToolError, match="escapes"):
        run("workspace.read", ctx, path="out/secret.txt")
    with pytest.raises(ToolError, match="escapes"):
        run("workspace.write", ctx, path="out/new.txt", content="pwned")
    with pytest.raises(ToolError, match="escapes"):
        run("workspace.write", ctx, path="out/deeper/new.txt", content="pwned")
    assert snapshot(outside) == before
    assert not (outside / "deeper").exists()


def test_dangling_symlink_pointing_outside_is_not_written_through(ctx, outside):
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "new.txt").symlink_to(outside / "created.txt")
    with pytest.raises(ToolError, match="escapes"):
        run("workspace.write", ctx, path="new.txt", content="pwned")
    assert not (outside / "created.txt").exists()


def test_symlink_loop_is_refused(ctx):
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "loop").symlink_to(ctx.workspace / "loop")
    with pytest.raises(ToolError):
        run("workspace.read", ctx, path="loop")


def test_symlink_within_the_workspace_is_allowed(ctx):
    run("workspace.write", ctx, path="real.txt", content="inside")
    (ctx.workspace / "alias.txt").symlink_to(ctx.workspace / "real.txt")
    assert run("workspace.read", ctx, path="alias.txt") == "inside"
    assert "alias.txt (symlink)" in run("workspace.list", ctx)


def test_list_does_not_follow_symlinks_outside(ctx, outside):
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "out").symlink_to(outside, target_is_directory=True)
    listing = run("workspace.list", ctx)
    assert listing == "out (symlink)"
    assert "secret" not in listing


def test_workspace_root_being_a_symlink_still_works(tmp_path, settings):
    real = tmp_path / "real-root"
    real.mkdir()
    (tmp_path / "link-root").symlink_to(real, target_is_directory=True)
    settings.TERRET_WORKSPACE_ROOT = tmp_path / "link-root"
    ctx = builtins.context_for(uuid.uuid4(), "c")
    run("workspace.write", ctx, path="a.txt", content="ok")
    assert (real / ctx.session_id.hex / "a.txt").read_text() == "ok"


def test_read_size_limit(ctx):
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "ok.txt").write_bytes(b"a" * MAX_READ_BYTES)
    (ctx.workspace / "big.txt").write_bytes(b"a" * (MAX_READ_BYTES + 1))
    assert len(run("workspace.read", ctx, path="ok.txt")) == MAX_READ_BYTES
    with pytest.raises(ToolError, match="read limit"):
        run("workspace.read", ctx, path="big.txt")


def test_write_size_limit_counts_utf8_bytes(ctx):
    run("workspace.write", ctx, path="ok.txt", content="a" * MAX_WRITE_BYTES)
    # Two bytes per character: under the limit in characters, over it in bytes.
    with pytest.raises(ToolError, match="write limit"):
        run("workspace.write", ctx, path="big.txt", content="é" * (MAX_WRITE_BYTES // 2 + 1))
    assert not (ctx.workspace / "big.txt").exists()


def test_read_refuses_missing_dirs_binary_and_fifos(ctx):
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "dir").mkdir()
    (ctx.workspace / "bin").write_bytes(b"\xff\xfe\x00")
    os.mkfifo(ctx.workspace / "fifo")
    with pytest.raises(ToolError, match="no such file"):
        run("workspace.read", ctx, path="missing.txt")
    with pytest.raises(ToolError, match="not a regular file"):
        run("workspace.read", ctx, path="dir")
    with pytest.raises(ToolError, match="not UTF-8"):
        run("workspace.read", ctx, path="bin")
    with pytest.raises(ToolError, match="not a regular file"):  # and it must not block
        run("workspace.read", ctx, path="fifo")


def test_write_refuses_directories_and_file_parents(ctx):
    run("workspace.write", ctx, path="file.txt", content="x")
    (ctx.workspace / "dir").mkdir()
    with pytest.raises(ToolError, match="directory"):
        run("workspace.write", ctx, path="dir", content="x")
    with pytest.raises(ToolError, match="parent"):
        run("workspace.write", ctx, path="file.txt/child.txt", content="x")
    assert (ctx.workspace / "file.txt").read_text() == "x"


def test_write_refuses_non_string_content(ctx):
    with pytest.raises(ToolError, match="content"):
        run("workspace.write", ctx, path="a.txt", content=5)


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
