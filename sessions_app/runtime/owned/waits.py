"""task.start and task.wait inside a turn (tools/tasks.py: Definition.parks).

A foreground task.start, or a task.wait on live tasks, appends task/waiting
for its call in the transaction that admits the task (or locks the waited
ones): the turn then parks in waiting_task, holding no worker and no lease,
the way a call waiting for a verdict does. Each waited task's terminal
receipt takes one off waiting_tasks and wakes the session; the resumed turn
finds the call's task/waiting in its log and every task settled, and the
call's result is their outcomes. A background task.start returns its
task_id at once.

A call resumed after a crash finds its task by (session, call_id): the
first attempt's admission is never repeated, so a call admits one task.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sessions_app import log
from sessions_app.errors import TaskRefused
from sessions_app.log.records import Fence, LoggedEvent
from sessions_app.models import AgentProfile, Session, Task
from sessions_app.runtime.owned import command, kinds, store, subagent


@dataclass(frozen=True)
class Answer:
    """The call's result now; a call still waiting has none (None instead)."""

    content: str
    is_error: bool = False


def answer(
    session_id: uuid.UUID,
    fence: Fence,
    profile: AgentProfile,
    name: str,
    call_id: str,
    args: dict[str, Any],
    events: list[LoggedEvent],
) -> Answer | None:
    """The result of a task.start or task.wait call, or None: it waits."""
    waiting = next((e for e in events if e.kind == "task/waiting" and e.data.get("call_id") == call_id), None)
    if waiting is not None:
        ids = [str(t) for t in waiting.data["task_ids"]]
        if any(e.kind == "task/wait_ended" and e.data.get("call_id") == call_id for e in events):
            return _as_they_stand(session_id, ids)  # its timeout passed: the state of each now
        return _settled(session_id, ids, single=name == "task.start")
    try:
        if name == "task.start":
            return _start(session_id, fence, profile, call_id, args)
        return _wait(session_id, fence, call_id, args)
    except TaskRefused as refused:
        return Answer(str(refused), True)


def _settled(session_id: uuid.UUID, task_ids: list[str], *, single: bool) -> Answer | None:
    tasks = {str(t.id): t for t in Task.objects.filter(session_id=session_id, id__in=task_ids)}
    if any(t.receipt_seq is None for t in tasks.values()):
        return None
    results = [store.result_of(tasks[tid]) for tid in task_ids if tid in tasks]
    body: Any = results[0] if single and results else results
    failed = single and bool(results) and results[0]["phase"] != "done"
    return Answer(json.dumps(body, ensure_ascii=False), failed)


def _as_they_stand(session_id: uuid.UUID, task_ids: list[str]) -> Answer:
    tasks = {str(t.id): t for t in Task.objects.filter(session_id=session_id, id__in=task_ids)}
    shown = [store.result_of(tasks[tid]) for tid in task_ids if tid in tasks]
    return Answer(json.dumps({"timed_out": True, "tasks": shown}, ensure_ascii=False))


def _start(
    session_id: uuid.UUID, fence: Fence, profile: AgentProfile, call_id: str, args: dict[str, Any]
) -> Answer | None:
    kind = args.get("kind")
    background = bool(args.get("background", False))
    version = kinds.current_version(kind) if isinstance(kind, str) else None
    if version is None:
        raise TaskRefused(f"unknown task kind {kind!r}; installed: {', '.join(n for n, _ in kinds.installed())}")
    started: dict[str, Any] = {}
    if kind == "command":
        spec = command.check(profile, args)
        started["argv"] = spec["argv"]
    elif kind != "subagent":
        raise TaskRefused(f"task kind {kind!r} cannot be started here")
    with log.locked(session_id, fence=fence) as tx:
        turn_seq = tx.row["open_turn_seq"]
        child: Session | None = None
        if kind == "subagent" and not Task.objects.filter(session_id=session_id, call_id=call_id).exists():
            # Checked under the parent's row lock: two calls racing cannot both pass the bounds.
            spec = subagent.check(Session.objects.get(id=session_id), profile, args)
            child = subagent.make_child(tx, spec)
            started.update(profile=spec["profile"], child_session=str(child.id))
        elif kind == "subagent":
            spec = {}
        task, _ = store.admit(
            tx,
            turn_seq=turn_seq,
            call_id=call_id,
            kind=kind,
            version=version,
            background=background,
            spec=spec,
            started=started,
            child_session=child,
        )
        live = 0 if task.background else store.wait_on(tx, [task], call_id)
    if task.background:
        return Answer(json.dumps({"task_id": str(task.id), "background": True}))
    if live:
        return None
    return _settled(session_id, [str(task.id)], single=True)


def _wait(session_id: uuid.UUID, fence: Fence, call_id: str, args: dict[str, Any]) -> Answer | None:
    ids = args.get("task_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise TaskRefused("task_ids must be a non-empty list of task ids")
    wanted = [_canonical(i) for i in ids]
    rows = {str(t.id): t for t in Task.objects.filter(session_id=session_id, id__in=[w for w in wanted if w])}
    unknown = [i for i, w in zip(ids, wanted, strict=True) if w not in rows]
    if unknown:
        raise TaskRefused(f"no task {unknown[0]!r} in this session")
    found = [rows[w] for w in dict.fromkeys(wanted) if w]
    timeout = args.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise TaskRefused("timeout_s must be a positive number of seconds")
    with log.locked(session_id, fence=fence) as tx:
        live = store.wait_on(tx, found, call_id, timeout_s=float(timeout) if timeout is not None else None)
    if live:
        return None
    return _settled(session_id, [str(t.id) for t in found], single=False)


def _canonical(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return ""
