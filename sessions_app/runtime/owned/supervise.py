"""What a worker runs for a task, and the reaper that ends orphans.

`start(task_id)` (the dispatch's, on commit of an admission or an abort)
claims a pending task under a new generation and runs its kind on a thread
of its own, so a long command holds no worker slot; the thread renews the
task's lease while the kind runs. A task with abort intent and no
supervisor is settled cancelled by that claim at once.

`reap()`, on every worker's clock (runtime/hooks.register_clock, next to
the schedules), ends what nobody owns:
- a running task whose supervisor is gone (its lease ran out, or on
  PostgreSQL its process's liveness lock is free): taken over under a new
  generation (so the dead supervisor can write nothing more), its process
  group killed, then settled failed {code: supervisor_lost}, or run again
  if its kind says it may be (rerunnable); a held outcome is committed;
- a live task whose owner is archived or revoked, or a foreground task whose
  turn has ended: abort intent, then the same path;
- a pending task nobody claimed within a lease (a lost start) is started again;
- a blocked task whose definition this worker now has is started again.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import BooleanField, F, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from sessions_app.models import Task, WorkerProcess
from sessions_app.runtime import counters, failpoints, hooks
from sessions_app.runtime.owned import command, kinds, store, subagent
from sessions_app.runtime.owned.supervision import Settlement, Supervision
from sessions_app.tools import tasks as task_tools

logger = logging.getLogger(__name__)

REAP_BATCH = 100


_running: set[threading.Thread] = set()
_running_lock = threading.Lock()


def start(task_id: str) -> None:
    """Run the task on a thread of this process (a worker's, or the embedded one's)."""
    threading.Thread(target=run_task, args=(task_id,), name=f"terret-task-{task_id[:8]}", daemon=True).start()


@contextmanager
def _supervising() -> Iterator[None]:
    thread = threading.current_thread()
    with _running_lock:
        _running.add(thread)
    try:
        yield
    finally:
        with _running_lock:
            _running.discard(thread)


def wait_settled(timeout: float) -> int:
    """At a worker's shutdown, after the drain began: wait (at most `timeout`
    seconds in all) for this process's supervisions of claimed tasks, which
    stop their work at their next poll, to settle them while the process
    still holds its liveness lock; how many were still running after it. A
    task not claimed yet is not waited for (nothing of it is held here). The
    threads are daemons, so one that outlasts the bound is cut off with the
    process and its task is the reaper's (held, or found unowned), as after a kill."""
    deadline = time.monotonic() + timeout
    with _running_lock:
        threads = list(_running)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sum(1 for thread in threads if thread.is_alive())


def run_task(task_id: str) -> str:
    """Claim and run the task; what became of it (for logs and tests)."""
    try:
        failpoints.pause("task_start", _kind_of(task_id))
        claim = store.claim(task_id)
        if claim is None:
            return "not claimed"
        with _supervising():
            return _run(claim)
    except Exception:
        logger.exception("task %s failed in its supervisor", task_id)
        return "error"
    finally:
        connection.close()


def _kind_of(task_id: str) -> str:
    """The task's kind, for a failpoint's key (a read only when failpoints are set)."""
    if not settings.TERRET_FAILPOINTS:
        return ""
    return str(Task.objects.filter(id=task_id).values_list("kind", flat=True).first() or "")


def _run(claim: store.Claim) -> str:
    task = claim.task
    failpoints.pause("task_claimed", task.kind)
    if task.abort_requested_at is not None:
        store.settle(task.id, claim.generation, "cancelled", reason={"code": "cancelled", "by": task.abort_reason})
        return "cancelled"
    kind = kinds.resolve(task.kind, task.version)
    if kind is None:
        what = f"task kind {task.kind} v{task.version}"
        store.block(task.id, claim.generation, "definition_missing", what, f"this worker has no {what}")
        return "blocked"
    sup = Supervision(claim)
    try:
        ended = kind.run(sup)
    except Exception as exc:
        logger.exception("task %s (%s) raised", task.id, task.kind)
        ended = Settlement("failed", None, {"code": "error", "message": f"{type(exc).__name__}: {exc}"[:500]})
    if not ended.phase:
        return "lost"
    if ended.phase == "waiting":
        return "waiting"
    if not store.hold(task.id, claim.generation, ended.phase, ended.outcome, ended.reason):
        return "lost"
    failpoints.pause("task_held", task.kind)
    store.settle(task.id, claim.generation, ended.phase, outcome=ended.outcome, reason=ended.reason)
    return ended.phase


# -- the reaper


def reap() -> int:
    """One round of the reaper (module docstring); how many tasks it moved."""
    moved = 0
    moved += _orphans()
    moved += _unowned()
    moved += _restart()
    moved += _children()
    for session_id, call_id in store.expired_waits(REAP_BATCH):
        moved += store.end_wait(session_id, call_id)
    return moved


def _children() -> int:
    """Subagent tasks whose child is idle are settled (a crash may have
    lost the after-turn hook's settle); a child of an aborting task is
    stopped again until it is."""
    settled = 0
    waiting = Task.objects.filter(receipt_seq__isnull=True, kind=subagent.NAME, phase__in=("running", "waiting"))
    for task in waiting.exclude(child_session__isnull=True)[:REAP_BATCH]:
        if task.child_session_id is not None and subagent.settle_child(task.child_session_id):
            settled += 1
        elif task.abort_requested_at is not None:
            subagent.stop_child(task)
    return settled


def _after_turn(session_id: Any, facts: Any) -> None:
    """A child's turn ended: its parent's task may be settled now."""
    if settings.TERRET_FAILPOINTS and Task.objects.filter(child_session_id=session_id).exists():
        failpoints.pause("task_child_idle", subagent.NAME)
    subagent.settle_child(session_id)


def _orphans() -> int:
    """Abort intent on live tasks whose owner is gone or ended."""
    gone = Q(session__archived_at__isnull=False) | Q(session__revoked_seq__isnull=False)
    # A foreground task's owner is its turn: once that turn has ended, nothing waits on it.
    ended = Q(background=False) & (Q(session__open_turn_seq__isnull=True) | ~Q(session__open_turn_seq=F("turn_seq")))
    found = list(
        Task.objects.filter(receipt_seq__isnull=True, abort_requested_at__isnull=True)
        .filter(gone | ended)
        .select_related(None)[:REAP_BATCH]
    )
    if found:
        store.request_abort(found, "orphaned")
    return len(found)


def _unowned() -> int:
    """Tasks whose supervisor is gone: taken over and ended (or run again)."""
    now = timezone.now()
    candidates = Task.objects.filter(receipt_seq__isnull=True, phase__in=("running", "completing"))
    expired = Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
    if connection.vendor == "postgresql":
        gone = store.process_gone(f"{Task._meta.db_table}.supervisor_process")
        expired |= Q(RawSQL(gone, [], output_field=BooleanField()))  # noqa: S611 - constant SQL
    host = socket.gethostname()
    # Another host's group only that host can kill; but a host with no worker
    # registered any more is gone, and its tasks are ended from here.
    hosts_alive = WorkerProcess.objects.values("host")
    ours = Q(host="") | Q(host=host) | ~Q(host__in=hosts_alive)
    moved = 0
    for task_id in candidates.filter(expired).filter(ours).values_list("id", flat=True)[:REAP_BATCH]:
        claim = store.claim(task_id, takeover=True)
        if claim is None:
            continue
        moved += 1
        counters.add("task_takeovers")
        _end_unowned(claim)
    return moved


def _end_unowned(claim: store.Claim) -> None:
    task = claim.task
    kind = kinds.resolve(task.kind, task.version)
    here = task.host in ("", socket.gethostname())
    if task.kind == "command" and here:
        command.reap(task.id, task.pgid)
    if claim.phase_before == "completing" and task.outcome is not None:
        held = (task.checkpoint or {}).get("held", "done")
        store.settle(task.id, claim.generation, held, outcome=task.outcome, reason=task.reason)
    elif task.abort_requested_at is not None:
        store.settle(task.id, claim.generation, "cancelled", reason={"code": "cancelled", "by": task.abort_reason})
    elif kind is not None and kind.rerunnable:
        Task.objects.filter(id=task.id, generation=claim.generation).update(phase="pending", pgid=None)
        store.start_now(task.id)
    else:
        reason = {"code": "supervisor_lost", "supervisor": task.supervisor or ""}
        if not here:
            reason["host_gone"] = task.host
        store.settle(task.id, claim.generation, "failed", reason=reason)


def _restart() -> int:
    """Pending tasks whose start got lost, and blocked ones this worker can run."""
    stale = timezone.now() - timedelta(seconds=settings.TERRET_LEASE_SECONDS)
    pending = list(
        Task.objects.filter(receipt_seq__isnull=True, phase="pending", created_at__lt=stale)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=timezone.now()))
        .values_list("id", flat=True)[:REAP_BATCH]
    )
    for task_id in pending:
        # Marked so a lost start is tried once a lease, not every round.
        Task.objects.filter(id=task_id, phase="pending").update(lease_expires_at=store.lease_ends())
        store.start_now(task_id)
    blocked = Task.objects.filter(receipt_seq__isnull=True, phase="blocked").values_list("id", "kind", "version")
    runnable = [tid for tid, name, version in blocked[:REAP_BATCH] if kinds.resolve(name, version) is not None]
    for task_id in runnable:
        store.unblock(task_id)
    return len(pending) + len(runnable)


_last_reap = 0.0


def _reap_clock() -> int:
    """The reaper on the workers' clock, at most once a second."""
    global _last_reap
    if time.monotonic() - _last_reap < 1.0:
        return 0
    _last_reap = time.monotonic()
    try:
        return reap()
    finally:
        connection.close()


class _AgentTasks:
    """What task.status and task.cancel reach (tools/tasks.py)."""

    def status(self, session_id: Any, task_id: str) -> dict[str, Any]:
        return store.as_json(store.task_of(session_id, task_id))

    def cancel(self, session_id: Any, task_id: str, *, by: str) -> dict[str, Any]:
        task = store.task_of(session_id, task_id)
        store.request_abort([task], f"cancelled by {by}")
        task.refresh_from_db()
        return store.as_json(task)


def setup() -> None:
    """Install the kinds, the reaper on the clock and the task tools' backend.
    (The store's dispatch is wired by the app's ready(): the dispatch sits
    above the turn runner, which this package is under.)"""
    kinds.install(command.KIND)
    kinds.install(subagent.KIND)
    store.on_abort(subagent.stop_child)
    hooks.register_after_turn(_after_turn)
    hooks.register_clock(_reap_clock)
    task_tools.register(_AgentTasks())
