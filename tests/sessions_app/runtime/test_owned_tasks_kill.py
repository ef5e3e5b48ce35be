"""Recovery of owned work (issue 30, point 9): the worker is killed at every
phase of a task, on each side of parent and child, and a second worker
takes over. Real Celery worker processes on PostgreSQL and Redis; the kill
lands exactly at a phase through a failpoint (sessions_app/runtime/failpoints.py,
`task_*:<kind>`) or at a state read from the database.

After each case: the task has exactly one terminal receipt, tasks_audit and
effects_audit hold for the parent and any child, the parent is told (the
parked turn's tool result, or a background task's follow-up turn), no
process of a command is left running, and nothing ran twice: a command
appends a line to a file outside its scratch directory at its start (the
lines are its executions), a child's turns and model requests are counted
at the fake provider.

Phases and why some are not here:
- command: pending (its start taken, not claimed), claimed (running, not yet
  spawned), running (its group alive), completing (outcome held, no receipt).
  `waiting` is a subagent's phase only; `blocked` is covered by the kinds
  tests (test_owned_tasks.py: a worker lacking the kind), a kill there
  changes nothing (no supervisor, no lease).
- subagent: pending, claimed (starting the child: running, not parked),
  parked (the parent's turn in waiting_task, the child mid-turn: the kill of
  the child's worker, and of the other one, the parent's side), child idle
  (its last turn ended, the task not yet settled). A subagent never holds an
  outcome in `completing` (its child's idleness settles it directly:
  subagent.settle_child), so task_held is unreachable for it.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Session, Task
from sessions_app.runtime.owned import command
from sessions_app.runtime.owned.audit import tasks_audit
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for
from tests.sessions_app.runtime import test_owned_tasks_worker as worker_tests
from tests.sessions_app.runtime.test_owned_tasks_worker import audits_hold, turn_ends
from tests.workers import WorkerProcess

pytestmark = [pytest.mark.worker, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# The worker tests' fixtures, defined there once: the parent's profile and session, the child's profile.
session = worker_tests.session
helper = worker_tests.helper

PAUSE = 60  # a failpoint's pause: the kill always lands inside it
CHILD_PROMPT = "think it over"


@dataclass(frozen=True)
class Case:
    point: str  # a failpoint (task_*), or "running"/"parked": a state read from the database
    sig: signal.Signals
    background: bool
    side: str = ""  # subagents parked: "child" kills the child's worker, "parent" the other one
    pause: float = PAUSE


def kill(worker: WorkerProcess, sig: signal.Signals) -> None:
    if sig == signal.SIGKILL:
        worker.kill()
    else:
        worker.terminate()
        worker.wait_exit(30)


def paused_at(worker: WorkerProcess, point: str, kind: str) -> None:
    wait_for(lambda: f"failpoint {point}:{kind}: pausing" in worker.output(), 20, f"{point} reached")


def the_task(session: Session) -> Task:
    return wait_for(lambda: Task.objects.filter(session=session).first(), 15, "the task")


def one_receipt(task: Task) -> Task:
    """Exactly one terminal receipt in the owner's log, and the row agrees."""
    settled = wait_for(lambda: Task.objects.filter(id=task.id, receipt_seq__isnull=False).first(), 30, "the receipt")
    receipts = [e for k in ("task/completed", "task/failed", "task/cancelled") for e in events(task.session, k)]
    assert [r["task_id"] for r in receipts].count(str(task.id)) == 1, receipts
    return settled


def told(session: Session, task: Task, background: bool, fake_llm: Any) -> None:
    """The parent hears of the end: a waited call's tool result, or (background) a follow-up turn."""
    if background:
        wait_for(lambda: turn_ends(session) == ["completed", "completed"], 30, "the parent's follow-up turn")
        assert f"[task {task.id} ({task.kind})" in json.dumps(fake_llm.requests[-1]["messages"])
    else:
        wait_for(lambda: turn_ends(session) == ["completed"], 30, "the parked turn's end")
        (result,) = [r for r in events(session, "tool/result") if str(task.id) in r["content"]]
        assert json.loads(result["content"])["phase"] == task.phase


# --- command --------------------------------------------------------------------------


COMMAND_CASES = {
    "pending-kill": Case("task_start", signal.SIGKILL, background=False),
    "pending-term": Case("task_start", signal.SIGTERM, background=True),
    "claimed-kill": Case("task_claimed", signal.SIGKILL, background=False),
    "running-kill": Case("running", signal.SIGKILL, background=True),
    "running-term": Case("running", signal.SIGTERM, background=False),
    "completing-kill": Case("task_held", signal.SIGKILL, background=False),
    "completing-term": Case("task_held", signal.SIGTERM, background=True),
}


@pytest.mark.parametrize("case", COMMAND_CASES.values(), ids=COMMAND_CASES.keys())
def test_a_command_killed_at_each_phase_ends_with_one_receipt_and_ran_at_most_once(
    case: Case, start_worker: Any, fake_llm: Any, session: Session, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.log"
    sleep = 30 if case.point == "running" else 0
    argv = ["sh", "-c", f"echo run >> {runs}; sleep {sleep}; echo out"]
    call = {"kind": "command", "argv": argv, "timeout_s": 60, "background": case.background}
    fake_llm.script(Reply(tool_calls=[("task.start", call)]), Reply(text="noted"), Reply(text="told"))
    env = {} if case.point == "running" else {"TERRET_FAILPOINTS": f"{case.point}:command={case.pause}"}
    first = start_worker(name="a", **env)
    services.inject(session.id, "run it", wake=True)
    task = the_task(session)
    if case.point == "running":
        task = wait_for(lambda: Task.objects.filter(id=task.id, pgid__isnull=False).first(), 15, "the process")
        assert command.group_alive(task.pgid)
    else:
        paused_at(first, case.point, "command")
    if case.point == "task_held":
        assert Task.objects.get(id=task.id).phase == "completing"
    if case.background:  # the turn ends at once; the kill lands after it
        wait_for(lambda: turn_ends(session) == ["completed"], 15, "the first turn's end")
    else:
        wait_for(lambda: Session.objects.get(id=session.id).status == "waiting_task", 15, "the park")

    kill(first, case.sig)
    killed = time.monotonic()
    start_worker(name="b")
    task = one_receipt(task)
    took = time.monotonic() - killed
    print(f"\n{case}: {task.phase} {task.reason} {took:.2f}s after the kill (gen {task.generation})")

    lines = runs.read_text().splitlines() if runs.exists() else []
    if case.point == "task_start":  # never claimed: started by the reaper, once
        assert task.phase == "done" and task.outcome == {"exit_code": 0, "output": "out\n"}
        assert lines == ["run"]
    elif case.point == "task_claimed":  # claimed, nothing spawned: not rerunnable, so failed and never run
        assert task.phase == "failed" and task.reason["code"] == "supervisor_lost"
        assert lines == []
    elif case.point == "running":
        assert task.phase == "failed" and task.reason["code"] == "supervisor_lost"
        assert lines == ["run"]
    else:  # the held outcome is what the receipt says, and the command did not run again
        assert task.phase == "done" and task.outcome == {"exit_code": 0, "output": "out\n"}
        assert lines == ["run"]
    assert not command.marked_groups(task.id), "no process of the task is left running"
    if task.pgid:
        assert not command.group_alive(task.pgid)
    told(session, task, case.background, fake_llm)
    # The call and its answer (the resumed turn's), and a background task's follow-up: none asked twice.
    assert len(fake_llm.requests) == 2 + case.background
    audits_hold(session)


# --- subagent -------------------------------------------------------------------------------


def responder(call: dict[str, Any], latency: float) -> Any:
    """Parent and child run at once, so the replies go by conversation, not in order."""

    def respond(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        first = next(m["content"] for m in messages if m["role"] == "user")
        last = messages[-1]
        if CHILD_PROMPT in json.dumps(first):
            return Reply(text="the answer is 4", latency=latency)  # the child: one slow step
        if last["role"] == "tool":
            return Reply(text="the helper was asked")
        if "[task " in json.dumps(last["content"]):
            return Reply(text="told")  # a background task's follow-up
        return Reply(tool_calls=[("task.start", call)])

    return respond


def child_requests(fake_llm: Any) -> int:
    return sum(CHILD_PROMPT in json.dumps(r["messages"][:2]) for r in fake_llm.requests)


def holder(workers: list[WorkerProcess], session_id: Any) -> WorkerProcess | None:
    owner = Session.objects.get(id=session_id).lease_owner
    if not owner:
        return None
    pid = int(owner.split(":")[1])
    return next((w for w in workers if w.pid == pid), None)


SUBAGENT_CASES = {
    "pending-kill": Case("task_start", signal.SIGKILL, background=False),
    "claimed-kill": Case("task_claimed", signal.SIGKILL, background=False),
    "parked-child-kill": Case("parked", signal.SIGKILL, background=False, side="child"),
    "parked-child-term": Case("parked", signal.SIGTERM, background=False, side="child"),
    "parked-parent-kill": Case("parked", signal.SIGKILL, background=False, side="parent"),
    "child-idle-kill": Case("task_child_idle", signal.SIGKILL, background=True),
    # The after-turn hook runs in the child's drive, which a warm shutdown lets finish: a short pause,
    # so the draining worker settles the task itself before it exits.
    "child-idle-term": Case("task_child_idle", signal.SIGTERM, background=False, pause=3),
}


@pytest.mark.parametrize("case", SUBAGENT_CASES.values(), ids=SUBAGENT_CASES.keys())
def test_a_subagent_killed_at_each_phase_on_each_side_ends_with_one_receipt(
    case: Case, start_worker: Any, fake_llm: Any, session: Session, helper: AgentProfile
) -> None:
    call = {"kind": "subagent", "profile": helper.name, "prompt": CHILD_PROMPT, "background": case.background}
    fake_llm.responder = responder(call, 4 if case.point == "parked" else 0.2)
    env = {} if case.point == "parked" else {"TERRET_FAILPOINTS": f"{case.point}:subagent={case.pause}"}
    workers = [start_worker(name="a", **env)]
    if case.point == "parked":
        workers.append(start_worker(name="a2"))
    services.inject(session.id, "ask the helper", wake=True)
    task = the_task(session)
    child_id = wait_for(lambda: Task.objects.get(id=task.id).child_session_id, 15, "the child")
    if case.point == "parked":
        wait_for(lambda: Session.objects.get(id=session.id).status == "waiting_task", 15, "the parent parked")
        wait_for(lambda: child_requests(fake_llm) >= 1, 15, "the child's model call")
        child_worker = wait_for(lambda: holder(workers, child_id), 10, "the child's worker")
        victim = child_worker if case.side == "child" else next(w for w in workers if w is not child_worker)
    else:
        victim = workers[0]
        paused_at(victim, case.point, "subagent")
    if case.point == "task_claimed":
        assert Task.objects.get(id=task.id).phase == "running"  # claimed, the child not yet woken
    if case.point == "task_child_idle":
        assert [e["status"] for e in events(Session.objects.get(id=child_id), "turn/end")] == ["completed"]
        assert Task.objects.get(id=task.id).receipt_seq is None

    kill(victim, case.sig)
    killed = time.monotonic()
    start_worker(name="b")
    task = one_receipt(task)
    print(f"\n{case}: {task.phase} {task.outcome} {time.monotonic() - killed:.2f}s after the kill")
    assert task.phase == "done" and task.outcome == {"answer": "the answer is 4"}
    child = Session.objects.get(id=child_id)
    assert [e["status"] for e in events(child, "turn/end")] == ["completed"]  # one child turn, whatever died
    told(session, task, case.background, fake_llm)
    # The child's one step is asked again only when its own worker died mid-call.
    asked = child_requests(fake_llm)
    assert asked == 1 or (case.side == "child" and asked == 2), asked
    assert Session.objects.filter(parent_session=session).count() == 1  # no second child
    audits_hold(session)
    audits_hold(child)
    assert tasks_audit(session.id).counts.get("done") == 1
