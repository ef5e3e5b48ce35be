"""A task's row and its owner's log: every write of owned work.

Rules kept here:
- Every supervisor write is fenced on the task's `generation`: a claim bumps
  it, and a write of an older generation matches no row (a supervisor that
  was taken over can change nothing more).
- Exactly one terminal receipt per task: task/completed, task/failed or
  task/cancelled appended to the owner's log in the transaction that sets
  the row's receipt_seq, under the owner's row lock (log.locked) and then
  the task's (the order every writer here takes them in).
- Abort intent is committed before any signal: `request_abort` writes it;
  the supervisor reads it at its next renewal and only then signals.
- A waited task's receipt (the open turn is parked on it) takes one off the
  owner's waiting_tasks and wakes it; a background task's receipt comes with
  a follow-up (input/deferred with its task_id) that wakes the owner like any
  follow-up, under its budget and holds.
"""

from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import UnknownTask
from sessions_app.models import TASK_TERMINAL, Event, Task
from sessions_app.runtime import admission, documents, liveness
from sessions_app.runtime.lease import owner_id, process_gone

logger = logging.getLogger(__name__)

RECEIPTS = {"done": "task/completed", "failed": "task/failed", "cancelled": "task/cancelled"}
FOLLOW_UP_OUTCOME_CHARS = 4000  # of a background task's outcome in the owner's follow-up

# Set by supervise.setup() (it sits above the dispatch; this module is under the turn runner).
_start: Callable[[str], None] = lambda task_id: None  # noqa: E731
_wake: Callable[[str], None] = lambda session_id: None  # noqa: E731
# What an abort signals beyond the supervisor's own poll (a subagent's child is stopped).
_on_abort: list[Callable[[Task], None]] = []


def on_abort(fn: Callable[[Task], None]) -> None:
    if fn not in _on_abort:
        _on_abort.append(fn)


def use_dispatch(start: Callable[[str], None], wake: Callable[[str], None]) -> None:
    """How a committed admission starts its task, and a receipt wakes its owner."""
    global _start, _wake
    _start, _wake = start, wake


def start_on_commit(task_id: uuid.UUID | str) -> None:
    tid = str(task_id)
    transaction.on_commit(lambda: _start(tid))


def start_now(task_id: uuid.UUID | str) -> None:
    _start(str(task_id))


def wake_on_commit(session_id: uuid.UUID | str) -> None:
    _wake(str(session_id))  # the dispatch's own wake-up is sent on commit


# -- reading


def as_json(task: Task) -> dict[str, Any]:
    """A task as every door shows it (docs/protocol.md, "Tasks")."""
    out: dict[str, Any] = {
        "id": str(task.id),
        "kind": task.kind,
        "version": task.version,
        "phase": task.phase,
        "background": task.background,
        "owner": {"session_id": str(task.session_id), "turn_seq": task.turn_seq},
        "started_at": (task.started_at or task.created_at).isoformat(),
        "age_s": round(((task.ended_at or timezone.now()) - (task.started_at or task.created_at)).total_seconds(), 1),
    }
    if task.child_session_id is not None:
        out["child_session"] = str(task.child_session_id)
    if task.ended_at is not None:
        out["ended_at"] = task.ended_at.isoformat()
    if task.receipt_seq is not None and task.outcome is not None:
        out["outcome"] = task.outcome
    if task.reason is not None:
        out["reason"] = task.reason
    if task.kind == "command":
        out["argv"] = task.spec.get("argv", [])
        if task.receipt_seq is None:
            out["output"] = task.output_tail
    if task.abort_requested_at is not None and task.receipt_seq is None:
        out["aborting"] = True
    return out


def task_of(session_id: uuid.UUID | str, task_id: Any) -> Task:
    """The session's task `task_id` (UnknownTask otherwise, a malformed id too)."""
    try:
        tid = uuid.UUID(str(task_id))
    except ValueError:
        raise UnknownTask(f"no task {task_id!r} in this session") from None
    task = Task.objects.filter(id=tid, session_id=session_id).first()
    if task is None:
        raise UnknownTask(f"no task {task_id} in this session")
    return task


def result_of(task: Task) -> dict[str, Any]:
    """What a waiting call's tool result says of a settled task."""
    out: dict[str, Any] = {"task_id": str(task.id), "phase": task.phase}
    if task.outcome is not None:
        out["outcome"] = task.outcome
    if task.reason is not None:
        out["reason"] = task.reason
    if task.child_session_id is not None:
        out["child_session"] = str(task.child_session_id)
    return out


# -- admission


def admit(
    tx: log.SessionTx,
    *,
    turn_seq: int,
    call_id: str,
    kind: str,
    version: int,
    background: bool,
    spec: dict[str, Any],
    started: dict[str, Any] | None = None,
    child_session: Any = None,
) -> tuple[Task, bool]:
    """The task of `call_id` (made now, with task/started, or found: a
    resumed call finds what its first attempt made). Started on commit."""
    task, created = Task.objects.get_or_create(
        session_id=tx.session_id,
        call_id=call_id,
        defaults={
            "turn_seq": turn_seq,
            "kind": kind,
            "version": version,
            "background": background,
            "spec": spec,
            "child_session": child_session,
        },
    )
    if created:
        data: dict[str, Any] = {"task_id": str(task.id), "kind": kind, "version": version, "background": background}
        data["call_id"] = call_id
        data.update(started or {})
        tx.append("task/started", data)
        start_on_commit(task.id)
    return task, created


def wait_on(tx: log.SessionTx, tasks: list[Task], call_id: str, *, timeout_s: float | None = None) -> int:
    """The open turn's call `call_id` waits on `tasks`: task/waiting counts
    the live ones into waiting_tasks (the turn parks while any is). The task
    rows are locked after the owner's row, as every writer here locks them."""
    turn_seq = tx.row["open_turn_seq"]
    locked = list(Task.objects.select_for_update().filter(id__in=[t.id for t in tasks]))
    live = [t for t in locked if t.receipt_seq is None]
    data: dict[str, Any] = {"call_id": call_id, "task_ids": [str(t.id) for t in tasks], "live": len(live)}
    if timeout_s is not None and live:
        data["deadline_at"] = (timezone.now() + timedelta(seconds=timeout_s)).isoformat()
    tx.append("task/waiting", data)
    Task.objects.filter(id__in=[t.id for t in live]).update(waiter_turn=turn_seq, waiter_call=call_id)
    return len(live)


def end_wait(session_id: uuid.UUID | str, call_id: str) -> bool:
    """A task.wait whose deadline passed stops waiting (task/wait_ended):
    its still-live tasks come off waiting_tasks and are no longer waited on
    (a later receipt of a background one comes as a follow-up), and the
    session is woken. False when there is nothing to end."""
    with log.locked(session_id) as tx:
        turn_seq = tx.row["open_turn_seq"]
        if turn_seq is None:
            return False
        seen = Event.objects.filter(session_id=tx.session_id, seq__gte=turn_seq, data__call_id=call_id)
        if not seen.filter(kind="task/waiting").exists() or seen.filter(kind="task/wait_ended").exists():
            return False
        live = Task.objects.select_for_update().filter(
            session_id=tx.session_id, waiter_turn=turn_seq, waiter_call=call_id, receipt_seq__isnull=True
        )
        ids = [t.id for t in live]
        tx.append("task/wait_ended", {"call_id": call_id, "reason": "timeout", "live": len(ids)})
        Task.objects.filter(id__in=ids).update(waiter_turn=None, waiter_call="")
        wake_on_commit(tx.session_id)
    return True


def expired_waits(limit: int = 100) -> list[tuple[uuid.UUID, str]]:
    """(session, call) of open turns' task.wait calls whose deadline passed."""
    now = timezone.now().isoformat()
    rows = Event.objects.filter(
        kind="task/waiting",
        session__waiting_tasks__gt=0,
        session__open_turn_seq__isnull=False,
        seq__gte=F("session__open_turn_seq"),
        data__has_key="deadline_at",
    ).values_list("session_id", "data")[:limit]
    return [(sid, str(data["call_id"])) for sid, data in rows if str(data["deadline_at"]) <= now]


# -- the supervisor's claim and lease


@dataclass(frozen=True)
class Claim:
    task: Task
    generation: int
    phase_before: str  # pending: a fresh start; anything else: a takeover


def lease_ends() -> Any:
    return timezone.now() + timedelta(seconds=settings.TERRET_LEASE_SECONDS)


def _supervisor_gone(task: Task) -> bool:
    """Its supervisor's lease ran out, or (PostgreSQL) its process is gone."""
    if task.lease_expires_at is None or task.lease_expires_at <= timezone.now():
        return True
    if connection.vendor != "postgresql" or task.supervisor_process is None:
        return False
    key = int(task.supervisor_process)
    with connection.cursor() as cur:
        cur.execute(f"SELECT {process_gone(str(key))}")  # an int from our own column
        row = cur.fetchone()
    return bool(row and row[0])


def claim(task_id: uuid.UUID | str, *, takeover: bool = False) -> Claim | None:
    """This process supervises the task from now on, under a new generation:
    a pending task (a fresh start), or with `takeover` one whose supervisor
    is gone (the reaper). None when it is not this caller's to take."""
    with transaction.atomic():
        task = Task.objects.select_for_update(skip_locked=True).filter(id=task_id, receipt_seq__isnull=True).first()
        if task is None:
            return None
        before = task.phase
        if before == "pending" or (before == "blocked" and task.abort_requested_at is not None):
            pass  # a fresh start; or a blocked task's abort, settled without running anything
        elif not takeover or before == "blocked" or not _supervisor_gone(task):
            return None
        now = timezone.now()
        task.generation += 1
        task.supervisor = owner_id()
        task.supervisor_process = liveness.current_key()
        task.lease_expires_at = lease_ends()
        if before == "pending":
            task.phase = "running"
            task.started_at = task.started_at or now
        task.save(
            update_fields=["generation", "supervisor", "supervisor_process", "lease_expires_at", "phase", "started_at"]
        )
        return Claim(task, task.generation, before)


@dataclass(frozen=True)
class Renewal:
    held: bool  # False: taken over (or settled); the supervisor stops at once
    abort: bool  # abort intent is committed: signal, then settle cancelled


def renew(task_id: uuid.UUID, generation: int, *, tail: str | None = None) -> Renewal:
    """Extend the lease and read the abort intent, in one statement fenced
    on the generation; the output tail so far rides along."""
    fields: dict[str, Any] = {"lease_expires_at": lease_ends()}
    if tail is not None:
        fields["output_tail"] = tail
        fields["progress_at"] = timezone.now()
    live = Task.objects.filter(id=task_id, generation=generation, receipt_seq__isnull=True)
    if not live.update(**fields):
        return Renewal(False, False)
    aborting = live.filter(abort_requested_at__isnull=False).exists()
    return Renewal(True, aborting)


def set_process(task_id: uuid.UUID, generation: int, pgid: int | None, *, checkpoint: dict[str, Any]) -> bool:
    """Record where the task's process is (and the checkpoint saying so)
    before anything else: a reaper kills what is recorded here."""
    return bool(
        Task.objects.filter(id=task_id, generation=generation, receipt_seq__isnull=True).update(
            pgid=pgid, host=socket.gethostname(), checkpoint=checkpoint
        )
    )


def park(task_id: uuid.UUID, generation: int) -> bool:
    """waiting: the task holds no supervisor and no lease; what it waits on
    settles it (a subagent's child going idle)."""
    return bool(
        Task.objects.filter(id=task_id, generation=generation, receipt_seq__isnull=True).update(
            phase="waiting", lease_expires_at=None
        )
    )


def hold(task_id: uuid.UUID, generation: int, phase: str, outcome: dict[str, Any] | None, reason: Any) -> bool:
    """completing: the outcome is final and held; the receipt follows once
    the task's own subtree has settled."""
    checkpoint = {"held": phase}
    return bool(
        Task.objects.filter(id=task_id, generation=generation, receipt_seq__isnull=True).update(
            phase="completing", outcome=outcome, reason=reason, checkpoint=checkpoint
        )
    )


def block(task_id: uuid.UUID, generation: int, code: str, what: str, reason: str) -> bool:
    """blocked: the running code lacks what the task needs. Live, visible; the
    receipt waits for the definition or a cancel."""
    task = Task.objects.filter(id=task_id).values("session_id").first()
    if task is None:
        return False
    with log.locked(task["session_id"]) as tx:
        row = Task.objects.select_for_update().filter(id=task_id, generation=generation, receipt_seq__isnull=True)
        if not row.exclude(phase="blocked").update(phase="blocked", reason={"code": code, "what": what}):
            return False
        tx.append("task/blocked", {"task_id": str(task_id), "code": code, "what": what, "reason": reason})
    return True


def unblock(task_id: uuid.UUID) -> bool:
    """A blocked task whose definition is back starts again (pending)."""
    done = Task.objects.filter(id=task_id, phase="blocked", receipt_seq__isnull=True).update(
        phase="pending", reason=None
    )
    if done:
        start_on_commit(task_id)
    return bool(done)


# -- the terminal receipt


def settle(
    task_id: uuid.UUID | str,
    generation: int,
    phase: str,
    *,
    outcome: dict[str, Any] | None = None,
    reason: dict[str, Any] | None = None,
) -> bool:
    """Commit the task's terminal receipt (`phase`: done, failed, cancelled)
    in its owner's log; False when the generation was superseded or the task
    has its receipt already (so a stale supervisor, or a second reaper,
    writes nothing)."""
    assert phase in TASK_TERMINAL
    owner = Task.objects.filter(id=task_id).values("session_id").first()
    if owner is None:
        return False
    with log.locked(owner["session_id"]) as tx:
        task = Task.objects.select_for_update().filter(id=task_id).first()
        if task is None or task.generation != generation:
            return False
        if task.receipt_seq is None:
            _receipt(tx, task, generation, phase, outcome, reason)
            settled_now = True
        else:
            settled_now = False
    # Task-scoped documents end with their task (runtime/documents.py), after
    # the receipt's commit, each in a commit of its own: a crash between the
    # two leaves them live until the task is settled again (a reaper or a
    # stale supervisor), which finds the receipt and retires them then.
    documents.retire_task(owner["session_id"], str(task_id))
    return settled_now


def _receipt(
    tx: log.SessionTx,
    task: Task,
    generation: int,
    phase: str,
    outcome: dict[str, Any] | None,
    reason: dict[str, Any] | None,
) -> None:
    """The terminal receipt, and the follow-up that tells the owner of a background task's end."""
    waited = task.waiter_turn is not None and task.waiter_turn == tx.row["open_turn_seq"]
    data: dict[str, Any] = {"task_id": str(task.id), "kind": task.kind, "waited": waited}
    data["generation"] = generation
    if outcome is not None:
        data["outcome"] = outcome
    if reason is not None:
        data["reason"] = reason
    receipt = tx.append(RECEIPTS[phase], data)
    if waited:
        wake_on_commit(tx.session_id)
    elif phase != "cancelled" and tx.row["revoked_seq"] is None and _told(task):
        # A background task's end is news for the owner: a follow-up opens a turn of its own.
        text = _follow_up_text(task, phase, outcome, reason)
        admission.defer(tx, text, "follow_up", f"task:{task.id}", task_id=str(task.id))
        wake_on_commit(tx.session_id)
    task.phase = phase
    task.outcome = outcome
    task.reason = reason
    task.receipt_seq = receipt.seq
    task.ended_at = timezone.now()
    task.lease_expires_at = None
    task.save(update_fields=["phase", "outcome", "reason", "receipt_seq", "ended_at", "lease_expires_at"])


def _told(task: Task) -> bool:
    """Whether the owner hears of the end in a follow-up: a background task
    of a session that is not archived."""
    return task.background and not Task.objects.filter(id=task.id, session__archived_at__isnull=False).exists()


def _follow_up_text(task: Task, phase: str, outcome: dict[str, Any] | None, reason: dict[str, Any] | None) -> str:
    word = {"done": "completed", "failed": "failed", "cancelled": "was cancelled"}[phase]
    body = json.dumps({"outcome": outcome, "reason": reason} if reason else {"outcome": outcome}, ensure_ascii=False)
    if len(body) > FOLLOW_UP_OUTCOME_CHARS:
        body = body[:FOLLOW_UP_OUTCOME_CHARS] + "…"
    return f"[task {task.id} ({task.kind}) {word}] {body}"


# -- abort intent


def request_abort(tasks: Iterable[Task] | Any, reason: str) -> list[str]:
    """Commit abort intent on each live task (first, before any signal); each
    is then settled by its supervisor, or, pending or supervised by nobody,
    by a fresh claim (started here on commit) or the reaper. The ids marked."""
    now = timezone.now()
    live = [t for t in tasks if t.receipt_seq is None]
    ids = [str(t.id) for t in live]
    if not ids:
        return []
    Task.objects.filter(id__in=ids, receipt_seq__isnull=True, abort_requested_at__isnull=True).update(
        abort_requested_at=now, abort_reason=reason[:200]
    )
    for task in live:
        start_on_commit(task.id)  # a pending task is settled cancelled by its claim at once
        for signal in _on_abort:
            transaction.on_commit(lambda task=task, signal=signal: signal(task), robust=True)  # type: ignore[misc]
    return ids


def live_tasks(session_id: uuid.UUID | str) -> Any:
    return Task.objects.filter(session_id=session_id, receipt_seq__isnull=True)


def abort_session(session_id: uuid.UUID | str, reason: str) -> list[str]:
    """The full-stop policy's cancel of every live task the session owns."""
    return request_abort(list(live_tasks(session_id)), reason)
