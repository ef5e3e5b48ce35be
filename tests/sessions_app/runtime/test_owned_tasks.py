"""Owned work on the embedded path (runtime/owned/): task.start and task.wait
park the turn in waiting_task, a terminal receipt wakes it, a background
task's receipt wakes its owner through a follow-up, Stop cancels a running
command's whole process group, a missing kind blocks a task, and the reaper
ends a task whose supervisor is gone.

Turns are driven by hand (manual worker) and tasks are supervised by
supervise.run_task on a thread of the test, with real processes; the model
is the local fake server, requests counted there. Runs on SQLite and on
PostgreSQL alike (the worker-process tests are test_owned_tasks_worker.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client import generate_latest

from sessions_app import actions, services
from sessions_app.models import AgentProfile, Session, Task, WorkerProcess
from sessions_app.runtime import documents
from sessions_app.runtime.drive import drive
from sessions_app.runtime.effects import effects_audit
from sessions_app.runtime.owned import command, kinds, store, supervise
from sessions_app.runtime.owned.audit import tasks_audit
from sessions_app.services import budgets, operators
from sessions_app.services import sessions as session_services
from terret_site.metrics import REGISTRY
from tests.fakes.fake_llm import Reply
from tests.helpers import client_for, document_text, edit_profile, events, wait_for
from tests.helpers import kinds as kinds_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

TOOLS = ["task.start", "task.wait", "task.status", "task.cancel", "clock.now"]
# task.start and task.cancel ask a reviewer under the default policy; these tests have none.
NO_HUMAN = {"task.start": "never", "task.cancel": "never"}


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="tasks",
        roles={"main": "test/model"},
        builtin_tools=TOOLS,
        allow_floor=["*"],
        command_allow=["sh"],
        approvals=NO_HUMAN,
    )


def start(argv: list[str], *, background: bool, timeout_s: float = 60) -> Reply:
    args = {"kind": "command", "argv": argv, "timeout_s": timeout_s, "background": background}
    return Reply(tool_calls=[("task.start", args)])


def status(session: Session) -> str:
    return Session.objects.get(id=session.id).status


def audits_hold(session: Session) -> None:
    tasks, fx = tasks_audit(session.id), effects_audit(session.id)
    assert tasks.ok, tasks.problems
    assert fx.ok, fx.problems


def results(session: Session) -> list[dict[str, Any]]:
    return events(session, "tool/result")


def test_a_command_whose_argv_is_not_allowed_is_refused_and_nothing_runs(
    fake_llm: Any, session: Session, tmp_path: Path
) -> None:
    fake_llm.script(start(["python3", "-c", "open('marker.txt','w')"], background=False), Reply(text="ok"))
    services.run_turn(session.id, "run it")
    assert drive(session.id) == "ended"
    (result,) = results(session)
    assert result["is_error"] is True
    assert "'python3' is not allowed to run" in result["content"] and "nothing was started" in result["content"]
    assert Task.objects.count() == 0 and "task/started" not in kinds_of(session)
    assert document_text(session.id, "marker.txt") is None
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert len(fake_llm.requests) == 2
    audits_hold(session)


def test_a_foreground_command_parks_the_turn_in_waiting_task_until_its_receipt(fake_llm: Any, session: Session) -> None:
    fake_llm.script(start(["sh", "-c", "echo hello > marker.txt; echo out"], background=False), Reply(text="done"))
    services.run_turn(session.id, "run it")
    assert drive(session.id) == "parked"
    assert status(session) == "waiting_task"
    row = Session.objects.get(id=session.id)
    assert row.waiting_tasks == 1 and row.lease_owner == ""  # parked: no worker, no lease
    (task,) = Task.objects.all()
    assert (task.phase, task.background, task.kind) == ("pending", False, "command")
    assert len(fake_llm.requests) == 1
    audits_hold(session)

    assert supervise.run_task(str(task.id)) == "done"
    assert Session.objects.get(id=session.id).waiting_tasks == 0
    (receipt,) = events(session, "task/completed")
    assert receipt["waited"] is True and receipt["outcome"] == {"exit_code": 0, "output": "out\n"}
    assert drive(session.id) == "ended"
    assert events(session, "turn/end") == [{"status": "completed"}]
    (result,) = results(session)
    assert json.loads(result["content"])["outcome"] == {"exit_code": 0, "output": "out\n"}
    # The tool result reached the model: one request per step, counted at the fake provider.
    assert len(fake_llm.requests) == 2
    sent = fake_llm.requests[1]["messages"][-1]
    assert sent["role"] == "tool" and json.loads(sent["content"])["outcome"]["output"] == "out\n"
    assert document_text(session.id, "marker.txt") == "hello\n"
    audits_hold(session)


def test_a_command_works_on_the_sessions_documents_and_commits_what_it_changed(
    fake_llm: Any, session: Session, settings: Any, tmp_path: Path
) -> None:
    """A command's directory is a scratch copy of the documents, made on the
    supervising host: it reads what the agent or owner wrote, its changes come
    back as document versions by the task, and no host keeps a copy."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path / "host"
    documents.write(session.id, "notes.txt", b"from the journal\n", by="alice")
    documents.write(session.id, "old.txt", b"gone soon\n", by="alice")
    argv = ["sh", "-c", "tr a-z A-Z < notes.txt > upper.txt; rm old.txt"]
    fake_llm.script(start(argv, background=False), Reply(text="done"))
    services.run_turn(session.id, "run it")
    assert drive(session.id) == "parked"
    (task,) = Task.objects.all()
    assert supervise.run_task(str(task.id)) == "done"
    assert document_text(session.id, "upper.txt") == "FROM THE JOURNAL\n"
    assert document_text(session.id, "old.txt") is None  # removed in the scratch copy: retired
    assert document_text(session.id, "notes.txt") == "from the journal\n"
    (written,) = [e for e in events(session, "document/written") if e["name"] == "upper.txt"]
    assert written["by"] == f"task:{task.id}"
    left = [p.name for p in (tmp_path / "host").iterdir() if not p.name.startswith(".terret-owner-")]
    assert left == []  # the scratch directory is gone (this process's owner lock file stays while it lives)
    audits_hold(session)


def test_a_task_supervised_on_a_host_that_is_gone_is_ended_from_another(fake_llm: Any, session: Session) -> None:
    """Another host's process group only that host can kill; but once no
    worker of that host is registered, its unowned tasks are ended here,
    failed supervisor_lost naming the host, and no group here is touched."""
    fake_llm.script(start(["sh", "-c", "sleep 30"], background=True), Reply(text="ok"), Reply(text="told"))
    services.run_turn(session.id, "run it")
    drive(session.id)
    (task,) = Task.objects.all()
    claim = store.claim(task.id)
    assert claim is not None
    mine = subprocess.Popen(["sleep", "30"], start_new_session=True)  # a group here, with the recorded id
    try:
        expired = timezone.now() - timedelta(seconds=1)
        Task.objects.filter(id=task.id).update(host="elsewhere", pgid=mine.pid, lease_expires_at=expired)
        WorkerProcess.objects.create(key=424242, host="elsewhere", pid=1)
        supervise.reap()
        task.refresh_from_db()
        assert task.phase == "running"  # that host still has a worker: its reaper's job
        WorkerProcess.objects.filter(key=424242).delete()
        assert supervise.reap() >= 1
        task.refresh_from_db()
        assert task.phase == "failed"
        assert task.reason == {"code": "supervisor_lost", "supervisor": task.supervisor, "host_gone": "elsewhere"}
        assert mine.poll() is None and command.group_alive(mine.pid)  # not this host's group to kill
    finally:
        mine.kill()
        mine.wait()
    (follow_up,) = events(session, "input/deferred")
    assert follow_up["task_id"] == str(task.id)
    audits_hold(session)


def test_a_tasks_own_documents_retire_with_its_terminal_receipt(fake_llm: Any, session: Session) -> None:
    fake_llm.script(start(["sh", "-c", "true"], background=False), Reply(text="done"))
    services.run_turn(session.id, "run it")
    assert drive(session.id) == "parked"
    (task,) = Task.objects.all()
    documents.write(session.id, "scratch.json", b"{}", kind="json", scope="task", task=str(task.id), by="agent")
    documents.write(session.id, "keep.txt", b"kept", by="agent")
    assert document_text(session.id, "scratch.json") == "{}"
    assert supervise.run_task(str(task.id)) == "done"
    assert document_text(session.id, "scratch.json") is None
    assert document_text(session.id, "keep.txt") == "kept"
    (retired,) = events(session, "document/retired")
    assert (retired["name"], retired["reason"]) == ("scratch.json", "task_ended")
    assert not store.settle(task.id, task.generation + 1, "done", outcome={})  # another generation: nothing
    assert len(events(session, "document/retired")) == 1
    audits_hold(session)


def test_a_background_command_ends_the_turn_at_once_and_its_receipt_wakes_the_owner(
    fake_llm: Any, session: Session
) -> None:
    fake_llm.script(
        start(["sh", "-c", "echo done > marker.txt"], background=True),
        Reply(text="started it"),
        Reply(text="it finished"),
    )
    services.run_turn(session.id, "run it in the background")
    assert drive(session.id) == "ended"
    (result,) = results(session)
    task_id = json.loads(result["content"])["task_id"]
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert Task.objects.get(id=task_id).phase == "pending"

    assert supervise.run_task(task_id) == "done"
    (receipt,) = events(session, "task/completed")
    assert receipt["waited"] is False
    (follow_up,) = events(session, "input/deferred")
    assert follow_up["lane"] == "follow_up" and follow_up["task_id"] == task_id
    drive(session.id)  # the follow-up opens a turn of its own
    assert [e["status"] for e in events(session, "turn/end")] == ["completed", "completed"]
    assert len(fake_llm.requests) == 3
    assert f"[task {task_id} (command) completed]" in json.dumps(fake_llm.requests[2]["messages"])
    assert document_text(session.id, "marker.txt") is not None
    audits_hold(session)


def test_task_wait_waits_for_background_tasks_and_returns_their_outcomes(fake_llm: Any, session: Session) -> None:
    fake_llm.script(start(["sh", "-c", "echo one"], background=True), Reply(text="later"))
    services.run_turn(session.id, "start")
    drive(session.id)
    task_id = json.loads(results(session)[0]["content"])["task_id"]
    fake_llm.script(Reply(tool_calls=[("task.wait", {"task_ids": [task_id]})]), Reply(text="waited"))
    services.run_turn(session.id, "wait for it")
    assert drive(session.id) == "parked"
    assert status(session) == "waiting_task"
    supervise.run_task(task_id)
    assert events(session, "input/deferred") == []  # waited on: no follow-up, the waiting turn hears it
    assert drive(session.id) == "ended"
    waited = json.loads(results(session)[-1]["content"])
    assert waited == [{"task_id": task_id, "phase": "done", "outcome": {"exit_code": 0, "output": "one\n"}}]
    audits_hold(session)


def _wait_running(task_id: str) -> Task:
    return wait_for(
        lambda: Task.objects.filter(id=task_id, phase="running", pgid__isnull=False).first(), 10, "the process"
    )


def test_stop_cancels_a_running_background_command_and_kills_its_process_group(fake_llm: Any, session: Session) -> None:
    argv = ["sh", "-c", "sleep 3; echo done > marker.txt"]
    fake_llm.script(start(argv, background=True), Reply(text="started"))
    services.run_turn(session.id, "run it")
    drive(session.id)
    task_id = json.loads(results(session)[0]["content"])["task_id"]
    runner = threading.Thread(target=supervise.run_task, args=(task_id,))
    runner.start()
    task = _wait_running(task_id)
    assert command.group_alive(task.pgid)

    assert services.cancel(session.id, by="owner") is True  # Stop: the full-stop policy
    assert Task.objects.get(id=task_id).abort_requested_at is not None  # the intent, committed first
    runner.join(10)
    task.refresh_from_db()
    assert task.phase == "cancelled" and task.receipt_seq is not None
    assert not command.group_alive(task.pgid)
    assert events(session, "input/deferred") == []  # a cancel is not news for the owner
    time.sleep(3.5)
    assert document_text(session.id, "marker.txt") is None
    audits_hold(session)


def test_cancelling_a_turn_parked_on_a_foreground_command_settles_the_task_before_the_turn_closes(
    fake_llm: Any, session: Session
) -> None:
    fake_llm.script(start(["sh", "-c", "sleep 3; echo done > marker.txt"], background=False))
    services.run_turn(session.id, "run it")
    assert drive(session.id) == "parked"
    (task,) = Task.objects.all()
    runner = threading.Thread(target=supervise.run_task, args=(str(task.id),))
    runner.start()
    _wait_running(str(task.id))
    services.cancel(session.id, by="owner")
    assert events(session, "turn/end") == []  # descendants settle before the owner's cleanup
    runner.join(10)
    assert drive(session.id) == "ended"
    assert events(session, "turn/end") == [{"status": "cancelled"}]
    order = [k for k in kinds_of(session) if k in ("task/cancelled", "turn/end")]
    assert order == ["task/cancelled", "turn/end"]
    time.sleep(3.5)
    assert document_text(session.id, "marker.txt") is None
    audits_hold(session)


def test_a_task_whose_kind_the_code_lacks_is_blocked_never_dropped_and_runs_once_it_is_back(
    fake_llm: Any, session: Session
) -> None:
    fake_llm.script(start(["sh", "-c", "echo back"], background=True), Reply(text="ok"))
    services.run_turn(session.id, "run it")
    drive(session.id)
    (task,) = Task.objects.all()
    kinds.uninstall("command", 1)
    try:
        assert supervise.run_task(str(task.id)) == "blocked"
        task.refresh_from_db()
        assert task.phase == "blocked" and task.receipt_seq is None
        (blocked,) = events(session, "task/blocked")
        assert blocked["code"] == "definition_missing" and blocked["what"] == "task kind command v1"
        supervise.reap()
        assert Task.objects.get(id=task.id).phase == "blocked"  # still missing: stays blocked
    finally:
        kinds.install(command.KIND)
    supervise.reap()  # the definition is back: started again
    assert Task.objects.get(id=task.id).phase == "pending"
    assert supervise.run_task(str(task.id)) == "done"
    audits_hold(session)


def test_the_reaper_kills_the_group_of_a_task_whose_supervisor_is_gone(fake_llm: Any, session: Session) -> None:
    fake_llm.script(start(["sh", "-c", "sleep 30"], background=True), Reply(text="ok"), Reply(text="told"))
    services.run_turn(session.id, "run it")
    drive(session.id)
    (task,) = Task.objects.all()
    # A supervisor that spawned the process and then died: its claim, its record, no renewals.
    claim = store.claim(task.id)
    assert claim is not None
    cwd = command.scratch_root()
    env = {"PATH": os.environ["PATH"], command.MARKER: str(task.id)}
    proc = subprocess.Popen(["sh", "-c", "sleep 30"], cwd=cwd, env=env, start_new_session=True)
    store.set_process(task.id, claim.generation, proc.pid, checkpoint={"spawned": True})
    assert not tasks_audit(session.id).problems  # still owned: its lease runs
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert "nobody owns it" in " ".join(tasks_audit(session.id).problems)

    assert supervise.reap() >= 1
    proc.wait(5)
    task.refresh_from_db()
    assert task.phase == "failed" and task.reason["code"] == "supervisor_lost"
    assert task.generation == claim.generation + 1  # taken over: the dead supervisor's writes are fenced off
    assert not command.group_alive(proc.pid)
    assert not store.settle(task.id, claim.generation, "done", outcome={})  # the old generation writes nothing
    (follow_up,) = events(session, "input/deferred")  # the owner is told
    assert follow_up["task_id"] == str(task.id)
    drive(session.id)
    assert "supervisor_lost" in json.dumps(fake_llm.requests[-1]["messages"])
    audits_hold(session)


def test_task_status_and_cancel_as_tools(fake_llm: Any, session: Session) -> None:
    fake_llm.script(start(["sh", "-c", "sleep 30"], background=True), Reply(text="ok"))
    services.run_turn(session.id, "run it")
    drive(session.id)
    (task,) = Task.objects.all()
    runner = threading.Thread(target=supervise.run_task, args=(str(task.id),))
    runner.start()
    _wait_running(str(task.id))
    fake_llm.script(
        Reply(tool_calls=[("task.status", {"task_id": str(task.id)})]),
        Reply(tool_calls=[("task.cancel", {"task_id": str(task.id)})]),
        Reply(tool_calls=[("task.status", {"task_id": "not-a-task"})]),
        Reply(text="cancelled"),
    )
    services.run_turn(session.id, "check and stop it")
    drive(session.id)
    runner.join(10)
    got = [r for r in results(session)][1:]
    assert json.loads(got[0]["content"])["phase"] == "running"
    assert json.loads(got[1]["content"])["aborting"] is True
    assert got[2]["is_error"] and "no task" in got[2]["content"]
    assert Task.objects.get(id=task.id).phase == "cancelled"
    audits_hold(session)


# --- subagents ------------------------------------------------------------------


@pytest.fixture
def helper(db: None) -> AgentProfile:
    """The child's profile: it may run commands of its own."""
    return AgentProfile.objects.create(
        name="helper",
        roles={"main": "test/model"},
        builtin_tools=TOOLS,
        allow_floor=["*"],
        command_allow=["sh"],
        approvals=NO_HUMAN,
    )


def subagent(prompt: str, *, background: bool = False, **extra: Any) -> Reply:
    args = {"kind": "subagent", "profile": "helper", "prompt": prompt, "background": background, **extra}
    return Reply(tool_calls=[("task.start", args)])


def child_of(task: Task) -> Session:
    task.refresh_from_db()
    assert task.child_session_id is not None
    return Session.objects.get(id=task.child_session_id)


def test_a_foreground_subagent_parks_the_parent_and_its_answer_completes_the_parent_turn(
    fake_llm: Any, session: Session, helper: AgentProfile, owner: Any
) -> None:
    fake_llm.script(subagent("what is 2+2?"), Reply(text="4"), Reply(text="the child says 4"))
    services.run_turn(session.id, "ask a helper")
    assert drive(session.id) == "parked"
    assert status(session) == "waiting_task"
    (task,) = Task.objects.all()
    child = child_of(task)
    assert child.owner_id == session.owner_id and child.profile_id == helper.id
    assert events(child, "user/message") == [{"text": "what is 2+2?"}]  # the prompt is its first message
    (started,) = events(session, "task/started")
    assert started["child_session"] == str(child.id) and started["profile"] == "helper"

    assert supervise.run_task(str(task.id)) == "waiting"
    assert Task.objects.get(id=task.id).phase == "waiting"
    assert drive(child.id) == "ended"  # the child runs its own turn
    supervise.reap()  # (the after-turn hook's settle; the manual worker runs no hooks)
    task.refresh_from_db()
    assert task.phase == "done" and task.outcome == {"answer": "4"}
    assert drive(session.id) == "ended"
    assert events(session, "turn/end") == [{"status": "completed"}]
    # One request per step, counted at the fake provider: parent, child, parent.
    assert len(fake_llm.requests) == 3
    sent = fake_llm.requests[2]["messages"][-1]
    assert sent["role"] == "tool" and json.loads(sent["content"])["outcome"] == {"answer": "4"}

    page = client_for(owner).get(f"/sessions/{child.id}/").content.decode()
    assert "A subagent of" in page and f"/sessions/{session.id}/" in page  # parent and child link each other
    assert f"/sessions/{child.id}/" in client_for(owner).get(f"/sessions/{session.id}/").content.decode()
    detail = actions.session_detail(owner, child.id).as_json()
    assert detail["parent"] == {"session_id": str(session.id), "task_id": str(task.id)}
    assert actions.session_detail(owner, session.id).as_json()["parent"] is None
    audits_hold(session)
    audits_hold(child)


def test_the_depth_and_live_children_bounds_refuse_a_subagent(
    fake_llm: Any, session: Session, helper: AgentProfile, profile: AgentProfile
) -> None:
    edit_profile(profile, max_live_children=1)
    fake_llm.script(subagent("one", background=True), subagent("two", background=True), Reply(text="ok"))
    services.run_turn(session.id, "two helpers")
    drive(session.id)
    first, second = results(session)
    assert "task_id" in json.loads(first["content"])
    assert second["is_error"] and "max_live_children 1" in second["content"]
    assert Task.objects.count() == 1 and Session.objects.count() == 2

    edit_profile(profile, max_task_depth=0)
    fake_llm.script(subagent("deep"), Reply(text="ok"))
    services.run_turn(session.id, "deeper")
    drive(session.id)
    assert "max_task_depth 0" in results(session)[-1]["content"]
    assert Task.objects.count() == 1


def test_a_childs_spend_is_in_the_parents_budget_and_exhausting_it_holds_both(
    fake_llm: Any, session: Session, helper: AgentProfile
) -> None:
    budgets.set_budget(session.id, {"cost_usd": 0.015, "tokens": None, "steps": None, "turns": None})
    call = subagent("spend", background=True, budget_usd=0.01)
    call.usage = (10, 5, 0.001)  # priced: an unpriced entry would exhaust a cost budget by itself
    fake_llm.script(call, Reply(text="started", usage=(10, 5, 0.001)))
    services.run_turn(session.id, "ask")
    drive(session.id)
    (task,) = Task.objects.all()
    child = child_of(task)
    assert float(Session.objects.get(id=child.id).budget_cost_usd) == pytest.approx(0.01)  # reserved from the parent's
    assert Session.objects.get(id=child.id).parent_session_id == session.id  # what the claim reads for the tree
    fake_llm.script(Reply(text="spent it", usage=(1000, 500, 0.02)))
    supervise.run_task(str(task.id))
    drive(child.id)
    spent = budgets.budget_of(session.id)["spent"]
    assert spent["children"] == {"cost_usd": pytest.approx(0.02), "tokens": 1500}
    assert budgets.budget_of(session.id)["exhausted"]["budget"] == "cost_usd"
    # Both held: new input starts no turn in the parent, nor in the child.
    assert services.inject(session.id, "more", wake=True).disposition == "held"
    assert services.inject(child.id, "more", wake=True).disposition == "held"
    assert len(fake_llm.requests) == 2 + 1


def test_stopping_the_parent_cancels_a_subagent_running_a_command_and_its_group(
    fake_llm: Any, session: Session, helper: AgentProfile
) -> None:
    fake_llm.script(subagent("run a slow command", background=True), Reply(text="delegated"))
    services.run_turn(session.id, "delegate")
    drive(session.id)
    (task,) = Task.objects.all()
    child = child_of(task)
    supervise.run_task(str(task.id))
    fake_llm.script(start(["sh", "-c", "sleep 3; echo done > marker.txt"], background=True), Reply(text="running"))
    drive(child.id)
    inner = Task.objects.get(session=child)
    runner = threading.Thread(target=supervise.run_task, args=(str(inner.id),))
    runner.start()
    inner = _wait_running(str(inner.id))

    services.cancel(session.id, by="owner")  # Stop on the parent: its full-stop policy reaches the child
    runner.join(10)
    inner.refresh_from_db()
    assert inner.phase == "cancelled" and not command.group_alive(inner.pgid)
    supervise.reap()
    task.refresh_from_db()
    assert task.phase == "cancelled"
    kinds_parent = kinds_of(session)
    assert kinds_parent.count("task/cancelled") == 1
    time.sleep(3.5)
    assert document_text(child.id, "marker.txt") is None
    audits_hold(session)
    audits_hold(child)


def test_the_chat_page_shows_a_task_card_whose_cancel_stops_it(
    fake_llm: Any, session: Session, owner: Any, make_user: Any
) -> None:
    fake_llm.script(start(["sh", "-c", "sleep 30"], background=True), Reply(text="ok"))
    services.run_turn(session.id, "run it")
    drive(session.id)
    (task,) = Task.objects.all()
    page = client_for(owner).get(f"/sessions/{session.id}/").content.decode()
    assert f'data-task-id="{task.id}"' in page and "command task" in page and "sh -c sleep 30" in page
    assert f"/tasks/{task.id}/cancel/" in page
    assert 'id="tasks-panel"' in page and "Live tasks" in page  # the session shows its live background tasks
    stranger = client_for(make_user("stranger")).post(f"/tasks/{task.id}/cancel/")
    assert stranger.status_code == 404 and Task.objects.get(id=task.id).abort_requested_at is None
    response = client_for(owner).post(f"/tasks/{task.id}/cancel/")
    assert response.status_code == 302
    assert supervise.run_task(str(task.id)) == "cancelled"
    page = client_for(owner).get(f"/sessions/{session.id}/").content.decode()
    assert "cancelled" in page and "Live tasks" not in page


def test_task_wait_with_a_timeout_ends_the_wait_and_the_task_goes_on(fake_llm: Any, session: Session) -> None:
    fake_llm.script(start(["sh", "-c", "echo late"], background=True), Reply(text="started"))
    services.run_turn(session.id, "start")
    drive(session.id)
    (task,) = Task.objects.all()
    fake_llm.script(
        Reply(tool_calls=[("task.wait", {"task_ids": [str(task.id)], "timeout_s": 1})]), Reply(text="gave up waiting")
    )
    services.run_turn(session.id, "wait a second")
    assert drive(session.id) == "parked"
    supervise.reap()
    assert status(session) == "waiting_task"  # not yet due
    time.sleep(1.2)
    supervise.reap()
    (ended,) = events(session, "task/wait_ended")
    assert ended == {"call_id": ended["call_id"], "reason": "timeout", "live": 1}
    assert Session.objects.get(id=session.id).waiting_tasks == 0
    assert drive(session.id) == "ended"
    waited = json.loads(results(session)[-1]["content"])
    assert waited == {"timed_out": True, "tasks": [{"task_id": str(task.id), "phase": "pending"}]}
    # The task goes on; no longer waited on, its end comes as a follow-up.
    assert supervise.run_task(str(task.id)) == "done"
    (follow_up,) = events(session, "input/deferred")
    assert follow_up["task_id"] == str(task.id)
    audits_hold(session)


def test_ops_lists_live_blocked_and_orphaned_tasks_and_metrics_count_them(fake_llm: Any, session: Session) -> None:
    fake_llm.script(
        start(["sh", "-c", "echo one"], background=True),
        start(["sh", "-c", "echo two"], background=True),
        Reply(text="ok"),
    )
    services.run_turn(session.id, "two")
    drive(session.id)
    first, second = Task.objects.order_by("created_at")
    supervise.run_task(str(first.id))
    kinds.uninstall("command", 1)
    try:
        supervise.run_task(str(second.id))
    finally:
        kinds.install(command.KIND)
    found = operators.attention()
    assert [i.detail["task"]["id"] for i in found["tasks_blocked"]] == [str(second.id)]
    assert [i.detail["task"]["id"] for i in found["tasks_live"]] == []
    assert found["tasks_orphaned"] == []
    session_services.archive_session(session.id, by="owner")  # its live task is an orphan until the reaper ends it
    assert [i.detail["task"]["id"] for i in operators.attention()["tasks_orphaned"]] == [str(second.id)]
    text = generate_latest(REGISTRY).decode()
    assert 'terret_tasks{kind="command",phase="done"} 1.0' in text
    assert 'terret_tasks{kind="command",phase="blocked"} 1.0' in text
    # An abort settles a blocked task without running anything (its kind is still missing here).
    kinds.uninstall("command", 1)
    try:
        assert supervise.run_task(str(second.id)) == "cancelled"
    finally:
        kinds.install(command.KIND)
    assert operators.attention()["tasks_orphaned"] == []
    audits_hold(session)


def test_a_held_outcome_whose_supervisor_died_before_the_receipt_is_committed_by_the_reaper(
    fake_llm: Any, session: Session
) -> None:
    fake_llm.script(start(["sh", "-c", "echo held"], background=True), Reply(text="ok"))
    services.run_turn(session.id, "run it")
    drive(session.id)
    (task,) = Task.objects.all()
    claim = store.claim(task.id)
    assert claim is not None
    outcome = {"exit_code": 0, "output": "held\n"}
    assert store.hold(task.id, claim.generation, "done", outcome, None)  # then the supervisor dies
    assert Task.objects.get(id=task.id).phase == "completing" and events(session, "task/completed") == []
    Task.objects.filter(id=task.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    supervise.reap()
    task.refresh_from_db()
    assert task.phase == "done" and task.outcome == outcome  # the held outcome, final, committed once
    (receipt,) = events(session, "task/completed")
    assert receipt["outcome"] == outcome and receipt["generation"] == claim.generation + 1
    audits_hold(session)


def test_the_ops_page_shows_a_live_task_with_cancel(fake_llm: Any, session: Session, make_user: Any) -> None:
    fake_llm.script(start(["sh", "-c", "sleep 30"], background=True), Reply(text="ok"))
    services.run_turn(session.id, "run it")
    drive(session.id)
    (task,) = Task.objects.all()
    staff = make_user("ops", is_staff=True)
    page = client_for(staff).get("/ops/").content.decode()
    assert "Live tasks" in page and f"command task <code>{str(task.id)[:8]}</code>, pending, background" in page
    assert f"/tasks/{task.id}/cancel/" in page


# --- a dead embedded worker (issue 30, point 9; the worker-process kill matrix is test_owned_tasks_kill.py) ---


def dead_owner() -> str:
    """The lease owner of an in-process worker that died: this host, a pid no process has any more."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return f"{os.uname().nodename}:{gone.pid}:1:dead00"


def test_a_command_left_running_by_a_dead_embedded_worker_is_reaped_and_its_parked_turn_told_once(
    fake_llm: Any, session: Session
) -> None:
    """The worker died between the spawn and its record (no pgid, only the
    checkpoint saying it was spawning): the reaper finds the group by its
    marker, kills it, and settles the task failed once; the parked turn is
    woken with that result; a second round of the reaper changes nothing."""
    fake_llm.script(start(["sh", "-c", "sleep 30"], background=False), Reply(text="it was lost"))
    services.run_turn(session.id, "run it")
    assert drive(session.id) == "parked"
    (task,) = Task.objects.all()
    claim = store.claim(task.id)
    assert claim is not None
    assert store.set_process(task.id, claim.generation, None, checkpoint={"spawning": True})
    env = {"PATH": os.environ["PATH"], command.MARKER: str(task.id)}
    proc = subprocess.Popen(["sh", "-c", "sleep 30"], cwd=command.scratch_root(), env=env, start_new_session=True)
    try:
        expired = timezone.now() - timedelta(seconds=1)
        Task.objects.filter(id=task.id).update(
            supervisor=dead_owner(), supervisor_process=None, lease_expires_at=expired
        )
        assert command.marked_groups(task.id) == {proc.pid}
        assert "nobody owns it" in " ".join(tasks_audit(session.id).problems)

        assert supervise.reap() >= 1
        proc.wait(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    task.refresh_from_db()
    assert task.phase == "failed" and task.reason["code"] == "supervisor_lost"
    assert task.generation == claim.generation + 1 and task.pgid is None
    assert not command.marked_groups(task.id) and not command.group_alive(proc.pid)
    (receipt,) = events(session, "task/failed")
    assert receipt["waited"] is True and Session.objects.get(id=session.id).waiting_tasks == 0
    assert supervise.reap() == 0 and len(events(session, "task/failed")) == 1  # nothing more to move
    assert drive(session.id) == "ended"
    (result,) = results(session)
    assert json.loads(result["content"])["phase"] == "failed" and result["is_error"] is True
    assert events(session, "turn/end") == [{"status": "completed"}]
    assert len(fake_llm.requests) == 2
    audits_hold(session)


def test_a_subagent_whose_embedded_worker_died_starting_the_child_runs_once_on_the_next(
    fake_llm: Any, session: Session, helper: AgentProfile
) -> None:
    """Claimed by a worker that died before it woke the child: the reaper
    takes it over and, the kind being rerunnable, starts it again; the child
    runs its one turn and the parent's parked turn gets the answer."""
    fake_llm.script(subagent("what is 2+2?"), Reply(text="4"), Reply(text="the child says 4"))
    services.run_turn(session.id, "ask a helper")
    assert drive(session.id) == "parked"
    (task,) = Task.objects.all()
    claim = store.claim(task.id)
    assert claim is not None and Task.objects.get(id=task.id).phase == "running"
    expired = timezone.now() - timedelta(seconds=1)
    Task.objects.filter(id=task.id).update(supervisor=dead_owner(), supervisor_process=None, lease_expires_at=expired)

    assert supervise.reap() >= 1
    task.refresh_from_db()
    assert task.phase == "pending" and task.receipt_seq is None  # to run again (the dispatch's start is manual here)
    assert supervise.run_task(str(task.id)) == "waiting"
    child = child_of(task)
    assert drive(child.id) == "ended"
    supervise.reap()  # the after-turn hook's settle (the manual worker runs no hooks)
    task.refresh_from_db()
    assert task.phase == "done" and task.outcome == {"answer": "4"}
    assert len(events(session, "task/completed")) == 1
    assert drive(session.id) == "ended"
    assert events(child, "turn/end") == [{"status": "completed"}]
    assert Session.objects.filter(parent_session=session).count() == 1
    assert len(fake_llm.requests) == 3  # parent, child, parent: one per step
    audits_hold(session)
    audits_hold(child)
