"""Owned work against real Celery worker processes on PostgreSQL.

A background `sh -c "sleep 5; echo done > marker.txt"` lets the parent's
turn end at once and wakes it about 5 s later; Stop while it sleeps kills
its process group and the marker never appears; kill -9 of the worker
supervising it leaves the process running until another worker's reaper
takes the task over (at once: the dead worker's liveness lock is free),
kills the group and settles the task failed {code: supervisor_lost}, and
the parent is told. A foreground command parks the turn in waiting_task.
Model requests are counted at the fake provider; tasks_audit and
effects_audit hold after each.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session, Task
from sessions_app.runtime.effects import effects_audit
from sessions_app.runtime.owned import command
from sessions_app.runtime.owned.audit import tasks_audit
from tests.fakes.fake_llm import Reply
from tests.helpers import document_text, events, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SLEEPER = ["sh", "-c", "sleep 5; echo done > marker.txt"]


@pytest.fixture
def session(make_user: Any, settings: Any, tmp_path: Path) -> Session:
    settings.TERRET_WORKSPACE_ROOT = tmp_path  # read by worker_env when a worker starts
    profile = AgentProfile.objects.create(
        name="tasks-worker",
        roles={"main": "test/model"},
        builtin_tools=["task.start", "task.wait", "task.status", "task.cancel"],
        allow_floor=["*"],
        command_allow=["sh"],
        approvals={"task.start": "never", "task.cancel": "never"},  # no reviewer in these tests
    )
    return services.create_session(make_user(), profile)


def start(argv: list[str], *, background: bool) -> Reply:
    args = {"kind": "command", "argv": argv, "timeout_s": 60, "background": background}
    return Reply(tool_calls=[("task.start", args)])


def marker(session: Session) -> str | None:
    """The marker as the session's document (a command's directory is a scratch copy, committed when it ends)."""
    return document_text(session.id, "marker.txt")


def turn_ends(session: Session) -> list[str]:
    return [e["status"] for e in events(session, "turn/end")]


def the_task(session: Session) -> Task:
    return wait_for(lambda: Task.objects.filter(session=session).first(), 10, "the task")


def running(task: Task) -> Task:
    return wait_for(
        lambda: Task.objects.filter(id=task.id, phase="running", pgid__isnull=False).first(), 15, "the process"
    )


def audits_hold(session: Session) -> None:
    tasks, fx = tasks_audit(session.id), effects_audit(session.id)
    print(f"\ntasks_audit counts={tasks.counts} ok={tasks.ok}; effects_audit counts={fx.counts} ok={fx.ok}")
    assert tasks.ok, tasks.problems
    assert fx.ok, fx.problems


def test_a_background_command_ends_the_turn_at_once_and_wakes_the_parent_when_done(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(start(SLEEPER, background=True), Reply(text="started it"), Reply(text="the marker is there"))
    start_worker()
    began = time.monotonic()
    services.inject(session.id, "run it in the background", wake=True)
    wait_for(lambda: turn_ends(session) == ["completed"], 10, "the first turn's end")
    assert time.monotonic() - began < 4, "the turn does not wait for background work"
    assert marker(session) is None
    task = the_task(session)
    assert task.background

    wait_for(lambda: turn_ends(session) == ["completed", "completed"], 30, "the parent woken and answering")
    took = time.monotonic() - began
    assert 4.5 < took < 20, took
    (receipt,) = events(session, "task/completed")
    assert receipt["outcome"]["exit_code"] == 0 and receipt["waited"] is False
    assert marker(session) == "done\n"
    assert len(fake_llm.requests) == 3  # one per step: the call, its answer, the woken turn's answer
    assert f"[task {task.id} (command) completed]" in json.dumps(fake_llm.requests[2]["messages"])
    audits_hold(session)


def test_stop_while_the_command_sleeps_cancels_it_kills_the_group_and_no_marker_appears(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(start(SLEEPER, background=True), Reply(text="started it"))
    start_worker()
    services.inject(session.id, "run it in the background", wake=True)
    task = running(the_task(session))
    assert command.group_alive(task.pgid)
    assert services.cancel(session.id, by="owner") is True
    wait_for(lambda: Task.objects.get(id=task.id).phase == "cancelled", 10, "the cancelled receipt")
    assert not command.group_alive(task.pgid)
    assert len(events(session, "task/cancelled")) == 1
    time.sleep(6)  # past the sleep: had anything survived, the marker would be there
    assert marker(session) is None
    assert turn_ends(session) == ["completed"]  # a cancel wakes nobody
    audits_hold(session)


def test_kill_9_of_the_supervising_worker_another_reaps_the_group_and_the_parent_is_told(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(
        start(["sh", "-c", "sleep 30; echo done > marker.txt"], background=True),
        Reply(text="started it"),
        Reply(text="the task was lost"),
    )
    first = start_worker(name="a")
    services.inject(session.id, "run it in the background", wake=True)
    task = running(the_task(session))
    wait_for(lambda: turn_ends(session) == ["completed"], 10, "the first turn's end")
    first.kill()
    assert command.group_alive(task.pgid), "the supervisor's death leaves its process running"
    start_worker(name="b")
    killed = time.monotonic()
    wait_for(lambda: Task.objects.get(id=task.id).receipt_seq is not None, 15, "the reaper's receipt")
    print(f"\nreaped {time.monotonic() - killed:.2f}s after worker b was ready")
    assert time.monotonic() - killed < 5, "within the lease takeover time"
    task.refresh_from_db()
    assert task.phase == "failed" and task.reason["code"] == "supervisor_lost"
    assert not command.group_alive(task.pgid)
    (receipt,) = events(session, "task/failed")
    assert receipt["generation"] == task.generation and task.generation >= 2  # under the reaper's generation
    wait_for(lambda: turn_ends(session) == ["completed", "completed"], 20, "the parent told")
    assert "supervisor_lost" in json.dumps(fake_llm.requests[-1]["messages"])
    assert marker(session) is None
    audits_hold(session)


def test_a_foreground_command_parks_the_turn_in_waiting_task_and_its_answer_follows(
    start_worker: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(start(["sh", "-c", "sleep 2; echo foreground"], background=False), Reply(text="it said hi"))
    start_worker()
    services.inject(session.id, "run it", wake=True)
    # Parked: waiting_task, and no worker nor lease while it waits (the release follows the park's commit).
    row = wait_for(
        lambda: Session.objects.filter(id=session.id, waiting_tasks=1, lease_owner="").first(), 10, "the park"
    )
    # The task's own start (its run message, taken by a worker) may commit
    # after the park (it did on CI's loaded run): pending or running, not ended.
    assert row.status == "waiting_task" and Task.objects.get(session=session).phase in ("pending", "running")
    wait_for(lambda: Task.objects.filter(session=session, phase="running").exists(), 10, "the command running")
    assert Session.objects.get(id=session.id).status == "waiting_task"  # it runs while the turn stays parked
    wait_for(lambda: turn_ends(session) == ["completed"], 20, "the turn's end")
    (result,) = events(session, "tool/result")
    assert json.loads(result["content"])["outcome"] == {"exit_code": 0, "output": "foreground\n"}
    assert len(fake_llm.requests) == 2
    kinds = list(Event.objects.filter(session=session).order_by("seq").values_list("kind", flat=True))
    assert kinds.index("task/completed") < kinds.index("turn/end")  # the barrier: the task settled first
    audits_hold(session)


# --- subagents ------------------------------------------------------------------


@pytest.fixture
def helper(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="helper-worker",
        roles={"main": "test/model"},
        builtin_tools=["task.start", "task.cancel"],
        allow_floor=["*"],
        command_allow=["sh"],
        approvals={"task.start": "never", "task.cancel": "never"},
    )


def by_conversation(script: dict[tuple[str, str], Reply]) -> Any:
    """A responder answering by (the conversation's first user text, the last
    message's role): parent and child run at once, so no FIFO order holds."""

    def respond(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        first = next(m["content"] for m in messages if m["role"] == "user")
        text = first if isinstance(first, str) else json.dumps(first)
        key = next(k for k in script if k[0] in text and k[1] == messages[-1]["role"])
        return script[key]

    return respond


def test_a_foreground_subagent_on_workers_the_parent_waits_and_completes_with_the_answer(
    start_worker: Any, fake_llm: Any, session: Session, helper: AgentProfile
) -> None:
    call = {"kind": "subagent", "profile": helper.name, "prompt": "what is 2+2?", "background": False}
    # The child's answer is held until the parent's park has been seen: without the gate a fast machine ends
    # the child, and so the park, between two polls (CI did, twice).
    answer = threading.Event()
    fake_llm.script(
        Reply(tool_calls=[("task.start", call)]), Reply(text="4", hang=answer), Reply(text="the helper says 4")
    )
    start_worker()
    services.inject(session.id, "ask the helper", wake=True)
    wait_for(lambda: Session.objects.filter(id=session.id, waiting_tasks=1, lease_owner="").exists(), 30, "the park")
    answer.set()
    wait_for(lambda: turn_ends(session) == ["completed"], 30, "the parent's end")
    task = Task.objects.get(session=session)
    assert task.phase == "done" and task.outcome == {"answer": "4"}
    child = Session.objects.get(id=task.child_session_id)
    assert [e["status"] for e in events(child, "turn/end")] == ["completed"]
    assert len(fake_llm.requests) == 3  # parent, child, parent: one per step
    assert json.loads(fake_llm.requests[2]["messages"][-1]["content"])["outcome"] == {"answer": "4"}
    audits_hold(session)
    audits_hold(child)


def test_stop_of_the_parent_reaches_a_subagents_command_its_group_dies_and_no_marker_appears(
    start_worker: Any, fake_llm: Any, session: Session, helper: AgentProfile
) -> None:
    call = {"kind": "subagent", "profile": helper.name, "prompt": "run the slow one", "background": True}
    fake_llm.responder = by_conversation(
        {
            ("delegate", "user"): Reply(tool_calls=[("task.start", call)]),
            ("delegate", "tool"): Reply(text="delegated"),
            ("run the slow one", "user"): start(SLEEPER, background=True),
            ("run the slow one", "tool"): Reply(text="running"),
        }
    )
    start_worker()
    services.inject(session.id, "delegate", wake=True)
    task = the_task(session)
    child = Session.objects.get(id=wait_for(lambda: Task.objects.get(id=task.id).child_session_id, 10, "child"))
    inner = running(wait_for(lambda: Task.objects.filter(session=child).first(), 15, "the child's command"))
    assert command.group_alive(inner.pgid)
    services.cancel(session.id, by="owner")
    wait_for(lambda: Task.objects.get(id=task.id).phase == "cancelled", 15, "the subagent's cancelled receipt")
    inner.refresh_from_db()
    assert inner.phase == "cancelled" and not command.group_alive(inner.pgid)
    time.sleep(6)
    assert marker(child) is None
    audits_hold(session)
    audits_hold(child)


# --- SIGTERM and kill -9 elsewhere ---------------------------------------------------


@pytest.mark.parametrize("failpoints", ["", "task_held:command=3"], ids=["at-once", "slow-settle"])
def test_sigterm_of_the_supervising_worker_kills_the_group_and_settles_the_task(
    start_worker: Any, fake_llm: Any, session: Session, failpoints: str
) -> None:
    """A warm shutdown settles the task before the process goes. slow-settle:
    3 s between the held outcome and its settle (a loaded machine's worst
    case); the shutdown waits for it (tasks.SUPERVISIONS_SETTLE_SECONDS)."""
    fake_llm.script(
        start(["sh", "-c", "sleep 30; echo done > marker.txt"], background=True),
        Reply(text="started it"),
        Reply(text="it was stopped"),
    )
    first = start_worker(name="a", TERRET_FAILPOINTS=failpoints) if failpoints else start_worker(name="a")
    services.inject(session.id, "run it in the background", wake=True)
    task = running(the_task(session))
    wait_for(lambda: turn_ends(session) == ["completed"], 10, "the first turn's end")
    first.terminate()  # a deploy's warm shutdown: the supervisor stops its group before the process goes
    first.wait_exit(30)
    task.refresh_from_db()
    assert task.phase == "failed" and task.reason["code"] == "supervisor_lost"
    assert not command.group_alive(task.pgid)
    start_worker(name="b")  # the follow-up waits for a worker that stays
    wait_for(lambda: turn_ends(session) == ["completed", "completed"], 20, "the parent told")
    audits_hold(session)


def test_kill_9_while_the_child_runs_its_turn_the_child_recovers_and_the_parent_completes(
    start_worker: Any, fake_llm: Any, session: Session, helper: AgentProfile
) -> None:
    call = {"kind": "subagent", "profile": helper.name, "prompt": "think slowly", "background": False}
    fake_llm.responder = by_conversation(
        {
            ("ask the helper", "user"): Reply(tool_calls=[("task.start", call)]),
            ("ask the helper", "tool"): Reply(text="the helper answered"),
            ("think slowly", "user"): Reply(text="done thinking", latency=3),
        }
    )
    first = start_worker(name="a")
    services.inject(session.id, "ask the helper", wake=True)
    task = the_task(session)
    wait_for(lambda: len(fake_llm.requests) >= 2, 15, "the child's model call")
    first.kill()  # the child's turn dies mid-call; the parent is parked, holding nothing
    start_worker(name="b")
    wait_for(lambda: turn_ends(session) == ["completed"], 40, "the parent's end")
    task.refresh_from_db()
    assert task.phase == "done" and task.outcome == {"answer": "done thinking"}
    child = Session.objects.get(id=task.child_session_id)
    assert [e["status"] for e in events(child, "turn/end")] == ["completed"]
    audits_hold(session)
    audits_hold(child)
