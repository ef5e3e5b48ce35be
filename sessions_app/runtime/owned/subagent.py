"""The `subagent` kind: a child session of a named profile, owned by the
parent session through its task.

- Admitted with the parent's own bounds (its profile's max_task_depth and
  max_live_children, defaults 3 and 8) and budget: `budget_usd` becomes the
  child's own cost budget and may not exceed what the parent has left; the
  child's spend counts against the parent's too (runtime/limits.py), so an
  exhausted parent holds the whole tree.
- The child session is made in the admission's transaction, with its first
  turn opened on the prompt (a session like any other: its live page, API,
  turns, approvals and crash recovery are the ordinary ones). The kind's run
  wakes it and parks the task in `waiting`: no thread, no lease.
- When the child is idle (no open turn, no follow-up owed, no live task of
  its own: its subtree has settled), its last turn decides the task: the
  final answer is the outcome {answer}; a cancelled turn cancels it, any
  other end fails it. The after-turn hook settles it at once, the reaper's
  round catches whatever a crash left.
- A cancel stops the child (its turn and every task it owns: the same Stop a
  person has) and settles the task once the child is idle.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from sessions_app import log
from sessions_app.errors import TaskRefused
from sessions_app.log.reads import latest_of_kind
from sessions_app.models import AgentProfile, Session, Task
from sessions_app.runtime import admission, limits
from sessions_app.runtime.owned import store
from sessions_app.runtime.owned.kinds import TaskKind
from sessions_app.runtime.owned.supervision import Settlement, Supervision

NAME = "subagent"
VERSION = 1
MAX_PROMPT_CHARS = 100_000

# Set by the app's ready(): the services' Stop of a session (services.inputs.cancel).
_stop: list[Callable[..., Any]] = []


def use_stopper(stop: Callable[..., Any]) -> None:
    _stop[:] = [stop]


def depth_of(session_id: uuid.UUID | str) -> int:
    """How deep in a tree of subagents the session is (a top session: 0)."""
    return len(limits.ancestors(session_id))


def check(parent: Session, parent_profile: AgentProfile, args: dict[str, Any]) -> dict[str, Any]:
    """The child's spec, within the parent's bounds; TaskRefused otherwise (nothing started)."""
    name, prompt = args.get("profile"), args.get("prompt")
    if not isinstance(name, str) or not name:
        raise TaskRefused("a subagent needs `profile`: the name of its profile")
    if not isinstance(prompt, str) or not prompt.strip() or "\x00" in prompt or len(prompt) > MAX_PROMPT_CHARS:
        raise TaskRefused(f"a subagent needs `prompt`: its first message (1 to {MAX_PROMPT_CHARS} characters)")
    if not AgentProfile.objects.filter(name=name).exists():
        raise TaskRefused(f"no profile {name[:64]!r}")
    depth = depth_of(parent.id) + 1
    if depth > parent_profile.max_task_depth:
        raise TaskRefused(
            f"refused: a subagent here would be {depth} deep (max_task_depth {parent_profile.max_task_depth})"
        )
    live = Task.objects.filter(session_id=parent.id, kind=NAME, receipt_seq__isnull=True).count()
    if live >= parent_profile.max_live_children:
        raise TaskRefused(
            f"refused: this session has {live} live subagents (max_live_children {parent_profile.max_live_children})"
        )
    spec: dict[str, Any] = {"profile": name, "prompt": prompt}
    budget = args.get("budget_usd")
    if budget is not None:
        try:
            amount = Decimal(str(budget))
        except InvalidOperation:
            raise TaskRefused("budget_usd must be a number of US dollars") from None
        if isinstance(budget, bool) or not amount.is_finite() or amount < 0:
            raise TaskRefused("budget_usd must be a number of US dollars, 0 or more")
        left = _left(parent)
        if left is not None and amount > left:
            raise TaskRefused(f"refused: budget_usd {amount} is more than this session has left (${left})")
        spec["budget_usd"] = float(amount.quantize(Decimal("0.000001")))
    return spec


def _left(parent: Session) -> Decimal | None:
    spent, limit = limits.session_spent(parent.id)
    if limit["cost_usd"] is None:
        return None
    used = spent.cost_usd + limits.children_spent(parent.id).cost_usd
    return max(Decimal(0), Decimal(limit["cost_usd"]) - used)


def make_child(tx: log.SessionTx, spec: dict[str, Any]) -> Session:
    """The child session, in the parent's admission transaction (the
    parent's row is locked first, then the new child's), its budget set and
    its first turn opened on the prompt."""
    owner_id = Session.objects.filter(id=tx.session_id).values_list("owner_id", flat=True).get()
    profile = AgentProfile.objects.get(name=spec["profile"])
    child = Session.objects.create(owner_id=owner_id, profile=profile, parent_session_id=tx.session_id)
    with log.locked(child.id) as ctx:
        if "budget_usd" in spec:
            budget = {"cost_usd": spec["budget_usd"], "tokens": None, "steps": None, "turns": None, "by": "parent"}
            ctx.append("budget/updated", budget)
        admission.open_turn(ctx, spec["prompt"], f"session:{tx.session_id}")
    return child


def run(sup: Supervision) -> Settlement:
    """Wake the child and park: its turns run on their own; its idleness settles the task."""
    task = sup.task
    if task.child_session_id is None:
        return Settlement("failed", None, {"code": "no_child", "message": "the child session is gone"})
    if not store.park(task.id, sup.generation):
        return Settlement.lost()
    store.wake_on_commit(task.child_session_id)
    settle_child(task.child_session_id)  # it may have finished already
    return Settlement.parked()


def stop_child(task: Task) -> None:
    """The cancel's signal: the child's turn and every task it owns are stopped."""
    if task.child_session_id is not None:
        for stop in _stop:
            stop(task.child_session_id, by=f"task:{task.id}")


def settle_child(child_id: uuid.UUID | str) -> bool:
    """Settle the subagent task owning `child_id` if the child is idle and its
    subtree settled; True when it did."""
    task = Task.objects.filter(child_session_id=uuid.UUID(str(child_id)), receipt_seq__isnull=True).first()
    if task is None or task.phase in ("pending", "blocked"):
        return False
    row = Session.objects.filter(id=child_id).values("open_turn_seq", "queued_follow_ups").first()
    if row is None or row["open_turn_seq"] is not None or row["queued_follow_ups"] > 0:
        return False
    if store.live_tasks(child_id).exists():
        return False  # the owned-work barrier: the child's own tasks settle first
    end = latest_of_kind(child_id, "turn/end")
    if end is None:
        return False
    status = end.data.get("status")
    answer = latest_of_kind(child_id, "assistant/message")
    text = (answer.data.get("content") or "") if answer is not None and answer.seq < end.seq else ""
    if task.abort_requested_at is not None or status == "cancelled":
        return store.settle(
            task.id, task.generation, "cancelled", reason={"code": "cancelled", "by": task.abort_reason}
        )
    if status == "completed":
        return store.settle(task.id, task.generation, "done", outcome={"answer": text})
    reason = {"code": f"child_{status}", "error": str(end.data.get("error", ""))[:500]}
    return store.settle(task.id, task.generation, "failed", outcome={"answer": text}, reason=reason)


KIND = TaskKind(NAME, VERSION, run, rerunnable=True)
