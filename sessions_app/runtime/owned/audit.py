"""tasks_audit(session): every task in exactly one state, beside effects_audit.

A task holds when it is either settled, with exactly one terminal receipt in
its owner's log (at its receipt_seq, of its phase, after its task/started)
and no process of it left on this host; or live under a live owner (pending
and not yet claimed, blocked and visible, or supervised under an unexpired
lease). No receipt names a task that was never started, no task has two, and
no foreground task outlives the turn that owns it: its receipt precedes the
turn's end.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict

from django.utils import timezone

from sessions_app.models import TASK_TERMINAL, Event, Task
from sessions_app.runtime.effects import Audit
from sessions_app.runtime.owned import command, store

RECEIPT_KINDS = {v: k for k, v in store.RECEIPTS.items()}


def tasks_audit(session_id: uuid.UUID | str) -> Audit:
    tasks = {str(t.id): t for t in Task.objects.filter(session_id=session_id)}
    rows = Event.objects.filter(session_id=session_id, kind__in=["task/started", "turn/end", *RECEIPT_KINDS])
    started: dict[str, int] = {}
    receipts: dict[str, list[tuple[int, str]]] = defaultdict(list)
    turn_ends: list[int] = []
    for seq, kind, data in rows.order_by("seq").values_list("seq", "kind", "data"):
        if kind == "task/started":
            started[data["task_id"]] = seq
        elif kind == "turn/end":
            turn_ends.append(seq)
        else:
            receipts[data["task_id"]].append((seq, RECEIPT_KINDS[kind]))
    problems: list[str] = []
    counts: Counter[str] = Counter()
    now = timezone.now()
    for tid in started:
        if tid not in tasks:
            problems.append(f"task/started at seq {started[tid]} names task {tid}, which has no row")
    for tid, got in receipts.items():
        if tid not in started:
            problems.append(f"a receipt names task {tid}, which was never started")
        if len(got) > 1:
            problems.append(f"task {tid} has {len(got)} terminal receipts")
    for tid, task in tasks.items():
        counts[task.phase] += 1
        got = receipts.get(tid, [])
        if task.receipt_seq is not None:
            if task.phase not in TASK_TERMINAL:
                problems.append(f"task {tid} has a receipt but is {task.phase}")
            if (task.receipt_seq, task.phase) not in got:
                problems.append(f"task {tid}: no {task.phase} receipt at seq {task.receipt_seq}")
            if task.kind == "command" and command.marked_groups(tid):
                problems.append(f"task {tid} is settled but processes of it still run")
            if not task.background:
                after = [end for end in turn_ends if end > task.turn_seq]
                if after and after[0] < task.receipt_seq:
                    problems.append(f"foreground task {tid} settled after its turn ended (seq {after[0]})")
            continue
        if got:
            problems.append(f"task {tid} is live ({task.phase}) but its log has a receipt")
        if task.phase in ("running", "completing"):
            if task.lease_expires_at is None or task.lease_expires_at <= now:
                problems.append(f"task {tid} is {task.phase} and nobody owns it (its lease ran out)")
        if not task.background and any(end > task.turn_seq for end in turn_ends):
            problems.append(f"foreground task {tid} is live after its turn ended")
    counts["tasks"] = len(tasks)
    return Audit(dict(counts), problems)
