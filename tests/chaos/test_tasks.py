"""Owned work under kill -9 (issue 30, point 9): sessions start background
and foreground commands and subagents, and both workers are SIGKILLed in
turn (each replaced at once) while the commands run and the children think.

Every task ends with exactly one terminal receipt in its owner's log
(tasks_audit, through the probe, with the effect audit and the log
invariants of every parent and child), no command ran twice (each appends a
line to a file of its own at its start, outside its scratch directory; a
command is not rerunnable), each child ran one turn, and every background
task's owner was told in a turn of its own.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from tests.chaos import harness, invariants
from tests.chaos.harness import Chaos, last_role
from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.chaos]

TASK_TABLE = "sessions_app_task"
# (kind, background, how many sessions start one)
MIX = [("command", True, 3), ("command", False, 2), ("subagent", False, 2), ("subagent", True, 1)]
COMMAND_SECONDS = (0.3, 5.0)  # a command's sleep, drawn: some end before the kills, most run through them
CHILD_LATENCY = 2.0


def start_plan(call: dict[str, Any]) -> harness.Plan:
    """Step 1 starts the task; the step after its result (or its id) answers."""

    def plan(n: int, body: dict[str, Any]) -> Reply:
        if last_role(body) == "tool":
            return Reply(text="noted")
        return Reply(tool_calls=[("task.start", call)])

    return plan


def tasks_of(chaos: Chaos, sids: list[str]) -> list[dict[str, Any]]:
    rows = invariants.query(
        chaos.db,
        f"SELECT id, session_id, kind, background, phase, generation, reason, child_session_id, receipt_seq "
        f"FROM {TASK_TABLE} WHERE session_id::text = ANY(%s)",
        [sids],
    )
    keys = ("id", "session_id", "kind", "background", "phase", "generation", "reason", "child", "receipt_seq")
    return [dict(zip(keys, (str(v) if isinstance(v, uuid.UUID) else v for v in row), strict=True)) for row in rows]


@pytest.mark.timeout(240)
def test_owned_tasks_with_both_workers_killed(chaos: Chaos) -> None:
    runs = chaos.stack.root / "task-runs"
    runs.mkdir(exist_ok=True)
    requests_before = chaos.model.total()
    sids: list[str] = []
    prompts: dict[str, str] = {}
    for kind, background, count in MIX:
        for _ in range(count):
            sid = chaos.new_session(harness.TASK_PROFILE)
            label = f"{kind}-{'bg' if background else 'fg'}-{sid[:8]}"
            call: dict[str, Any] = {"kind": kind, "background": background}
            if kind == "command":
                script = f"echo run >> {runs / label}; sleep {chaos.rng.uniform(*COMMAND_SECONDS):.1f}; echo out"
                call.update(argv=["sh", "-c", script], timeout_s=60)
            else:
                prompt = f"child of {label}"
                prompts[prompt] = sid
                chaos.model.plans[prompt] = lambda n, body: Reply(text="the answer", latency=CHILD_LATENCY)
                call.update(profile=harness.TASK_PROFILE, prompt=prompt)
            chaos.post(sid, f"start {label}", start_plan(call))
            sids.append(sid)

    # Both workers die in turn, each replaced at once, while the tasks run.
    began = time.time()
    kills: list[float] = []
    for delay in (1.5, 2.0):
        time.sleep(chaos.rng.uniform(delay * 0.5, delay))
        victim = chaos.rng.choice(chaos.alive())
        kills.append(chaos.signal(victim, signal.SIGKILL))
        chaos.replace(victim)

    def all_settled() -> bool:
        tasks = tasks_of(chaos, sids)
        return len(tasks) == len(sids) and all(t["receipt_seq"] is not None for t in tasks)

    harness.wait_until(all_settled, 60, "every task's terminal receipt", chaos.stack)
    ended_after = time.time() - kills[-1]
    tasks = tasks_of(chaos, sids)
    children = [t["child"] for t in tasks if t["child"]]
    chaos.receipts.update({c: [] for c in children})
    report = chaos.check(sids + children, timeout=60)
    settled_after = time.time() - kills[-1]

    # Nothing ran twice: a command's executions, read at the target; a child's turns.
    executions = {p.name: len(p.read_text().splitlines()) for p in runs.iterdir()}
    assert all(n <= 1 for n in executions.values()), executions
    for child in children:
        ends = [e for e in chaos.events(child) if e.kind == "turn/end"]
        assert len(ends) == 1, f"child {child} ran {len(ends)} turns"
    # Every task's owner was told: a waited call's result in its (one) turn, or a follow-up turn.
    for t in tasks:
        turns = sum(e.kind == "turn/end" for e in chaos.events(t["session_id"]))
        expected = 2 if t["background"] and t["phase"] != "cancelled" else 1
        assert turns == expected, f"{t['kind']} task {t['id']} ({t['phase']}): its owner ran {turns} turns"
    assert report.tasks.get("tasks") == len(tasks), report.tasks  # the probe audited every task (children own none)

    ended = Counter(f"{t['kind']}_{t['phase']}" for t in tasks)
    reaped = sum(t["generation"] > 1 for t in tasks)
    lost = sum((t["reason"] or {}).get("code") == "supervisor_lost" for t in tasks)
    harness.summary(
        "owned tasks", sessions=len(sids), tasks_started=len(tasks), kills=len(kills),
        **dict(sorted(ended.items())), taken_over=reaped, supervisor_lost=lost,
        command_runs=sum(executions.values()), children=len(children),
        receipts_after_s=ended_after, settled_after_s=settled_after, turns=report.turns,
        model_requests=chaos.model.total() - requests_before,
        drill_s=time.time() - began,
    )  # fmt: skip
