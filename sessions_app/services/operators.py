"""Operators' actions: suspend and resume admission, retry, abandon a
blocked turn, revoke and restore a session; and what needs a human.

Each action validates (check), writes under the session row lock or in one
transaction (do), records itself in the operators' log (OperatorAction, with
actor and reason) and, for a session, as an event in the session's log; the
wake-ups go out on commit. The console (page, API, admin) calls only these.
Who may: staff, checked by the interfaces (permissions.is_operator).

`turn_progress` (a running turn's progress, runtime/progress.py) is
re-exported for the interfaces, which do not import the runtime.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import InvalidInput, NotAbandonable, UnknownSession
from sessions_app.log import catalogue
from sessions_app.log.reads import stalled_since, turn_events
from sessions_app.models import (
    AgentProfile,
    AgentVersion,
    EffectAudit,
    Event,
    Notification,
    OperatorAction,
    Session,
    Suspension,
    Task,
    WorkerProcess,
)
from sessions_app.runtime import codever, dispatch, limits
from sessions_app.runtime.closing import closing_entries
from sessions_app.runtime.failures import UNSUPPORTED_VERSION
from sessions_app.runtime.owned.store import as_json as task_json
from sessions_app.runtime.progress import STALL_STANDS, turn_progress
from sessions_app.runtime.registry import lease_live
from sessions_app.services import budgets, inputs, monitors, schedules
from sessions_app.tools.builtins import BUILTINS

SCOPES = ("global", "profile", "session")
MAX_REASON_CHARS = 500
WAKE_BATCH = 1000


def check_action(scope: Any, target: Any, reason: Any) -> tuple[str, str, str]:
    if scope not in SCOPES:
        raise InvalidInput(f"scope must be one of {', '.join(SCOPES)}")
    if not isinstance(target, str) or (scope != "global" and not target.strip()):
        raise InvalidInput("target must name the profile or the session (empty for global)")
    if reason is None:
        reason = ""
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS or "\x00" in reason:
        raise InvalidInput(f"reason must be a string of at most {MAX_REASON_CHARS} characters")
    if scope == "profile" and not AgentProfile.objects.filter(name=target).exists():
        raise InvalidInput(f"no agent profile {target!r}")
    if scope == "session":
        try:
            uuid.UUID(target)
        except ValueError:
            raise InvalidInput("target must be a session id") from None
        if not Session.objects.filter(id=target).exists():
            raise UnknownSession(f"no session {target}")
    return scope, "" if scope == "global" else target.strip(), reason


def _record(actor: str, action: str, scope: str, target: str, reason: str) -> None:
    OperatorAction.objects.create(actor=actor, action=action, scope=scope, target=target, reason=reason)


def suspend(scope: Any, target: Any, *, by: str, reason: Any = "") -> None:
    scope, target, reason = check_action(scope, target, reason)
    if scope == "session":
        with log.locked(target) as tx:
            if tx.row["suspended_seq"] is None:
                tx.append("session/suspended", {"by": by, "reason": reason})
            _record(by, "suspend", scope, target, reason)
        return
    with transaction.atomic():
        Suspension.objects.update_or_create(scope=scope, target=target, defaults={"by": by, "reason": reason})
        _record(by, "suspend", scope, target, reason)
    limits.forget_suspensions()


def resume(scope: Any, target: Any, *, by: str, reason: Any = "") -> int:
    """Lift a suspension; wakes what it held. Returns how many sessions were woken."""
    scope, target, reason = check_action(scope, target, reason)
    if scope == "session":
        with log.locked(target) as tx:
            if tx.row["suspended_seq"] is not None:
                tx.append("session/resumed", {"by": by, "reason": reason})
                if tx.row["open_turn_seq"] is not None or tx.row["held_seq"] is not None:
                    dispatch.wake(tx.session_id)
            _record(by, "resume", scope, target, reason)
        return 1
    with transaction.atomic():
        Suspension.objects.filter(scope=scope, target=target).delete()
        _record(by, "resume", scope, target, reason)
        held = Session.objects.filter(suspended_seq__isnull=True, revoked_seq__isnull=True)
        if scope == "profile":
            held = held.filter(agent__profile__name=target) | held.filter(profile__name=target)
        woken = [sid for sid in held.filter(open_turn_seq__isnull=False).values_list("id", flat=True)[:WAKE_BATCH]] + [
            sid for sid in held.filter(held_seq__isnull=False).values_list("id", flat=True)[:WAKE_BATCH]
        ]
        for sid in dict.fromkeys(woken):
            dispatch.wake(sid)  # on commit; the sweep catches any beyond the batch
    limits.forget_suspensions()
    return len(set(woken))


def retry(session_id: uuid.UUID | str, *, by: str, reason: str = "") -> None:
    _, _, reason = check_action("session", str(session_id), reason)
    inputs.retry(session_id, by=by, reason=reason)
    _record(by, "retry", "session", str(session_id), reason)


def abandon(session_id: uuid.UUID | str, *, by: str, reason: str = "") -> None:
    """Close a blocked turn `failed` (its owed calls get error results), for
    an operator who decided it will not succeed."""
    _, _, reason = check_action("session", str(session_id), reason)
    with log.locked(session_id) as tx:
        turn_seq = tx.row["open_turn_seq"]
        if turn_seq is None or tx.row["blocked_seq"] is None:
            raise NotAbandonable(f"session {tx.session_id} has no blocked turn")
        if lease_live(tx.row):
            raise NotAbandonable(f"a worker holds session {tx.session_id}; retry or cancel it instead")
        lapsed = tx.fence_out()
        error = f"abandoned by {by}" + (f": {reason}" if reason else "")
        for kind, data in closing_entries(turn_events(tx.session_id, turn_seq), "failed", error=error, by=by):
            tx.append(kind, data)
        if lapsed:
            dispatch.wake(tx.session_id)
        _record(by, "abandon", "session", str(tx.session_id), reason)


def revoke(session_id: uuid.UUID | str, *, by: str, reason: str = "") -> None:
    """Cancel the session's turn, deny every tool call from now on, and
    refuse its input until a staff member restores it."""
    _, _, reason = check_action("session", str(session_id), reason)
    with log.locked(session_id) as tx:
        if tx.row["revoked_seq"] is None:
            tx.append("session/revoked", {"by": by, "reason": reason})
        _record(by, "revoke", "session", str(tx.session_id), reason)
    inputs.cancel(session_id, by=by)
    # Revoked authority ends its wake-ups too (seed 003): restoring does not revive them.
    schedules.cancel_for_session(session_id, reason="the session was revoked", by=by)


def restore(session_id: uuid.UUID | str, *, by: str, reason: str = "") -> None:
    _, _, reason = check_action("session", str(session_id), reason)
    with log.locked(session_id) as tx:
        if tx.row["revoked_seq"] is not None:
            tx.append("session/restored", {"by": by, "reason": reason})
        _record(by, "restore", "session", str(tx.session_id), reason)


def free_held(session_id: uuid.UUID | str, *, by: str, reason: str = "") -> str:
    """Free a session's held input in the one way that applies to this
    session alone: lift its own suspension, or its own exhausted budget (a
    budget/updated with no limits, by the operator). A hold by a profile's or
    the installation's suspension or daily budget is not one session's to lift:
    InvalidInput names what to do instead. Returns what was done."""
    _, _, reason = check_action("session", str(session_id), reason)
    session = Session.objects.select_related("profile").get(id=session_id)
    if session.held_seq is None:
        raise InvalidInput("this session holds no input")
    if session.suspended_seq is not None:
        resume("session", str(session.id), by=by, reason=reason)
        return "resumed the session"
    over = limits.check(session.id, session.profile, opening=True)
    if over is not None and over.scope == "session":
        with transaction.atomic():
            budgets.set_budget(session.id, {}, by=by)
            _record(by, "free", "session", str(session.id), reason or f"lifted the session's budget ({over.message})")
        return "lifted the session's budget"
    if over is not None:
        raise InvalidInput(f"held by the {over.message}: raise that budget (the profile in the admin, or the settings)")
    hold = limits.hold_of(session.profile, suspended=False)
    if hold is not None:
        raise InvalidInput(f"held by the {hold.scope} suspension: resume that scope")
    with transaction.atomic():
        dispatch.wake(session.id)  # nothing holds it any more: its drive takes the input
        _record(by, "free", "session", str(session.id), reason or "nothing held it any more: woken")
    return "woke the session"


def record_decision(by: str, session_id: uuid.UUID | str, verdict: str, call_id: str, reason: str) -> None:
    """An approval decided on the operators' console, in the operators' log
    too (the approval/resolved event in the session's log names the reviewer)."""
    _record(by, verdict, "session", str(session_id), f"{call_id}: {reason}" if reason else call_id)


def held_reasons(session_ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Each session's latest input/held reason (one bounded read)."""
    rows = (
        Event.objects.filter(session_id__in=session_ids, kind="input/held")
        .order_by("session_id", "-seq")
        .values_list("session_id", "data")
    )
    out: dict[uuid.UUID, str] = {}
    for sid, data in rows[: len(session_ids) * 4]:
        out.setdefault(sid, str((data or {}).get("text") or "held"))
    return out


# ---------------------------------------------------------------- what needs a human (a selector)


@dataclass(frozen=True)
class Item:
    kind: str
    session_id: str | None
    title: str
    since: datetime | None
    detail: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        age = (timezone.now() - self.since).total_seconds() if self.since else None
        return {
            "kind": self.kind,
            "session_id": self.session_id,
            "title": self.title,
            "since": self.since.isoformat() if self.since else None,
            "age_seconds": None if age is None else round(age, 1),
            "detail": self.detail,
        }


ATTENTION_LIMIT = 200
ATTENTION_CALLS = 20  # an item's unknown calls, or audit problems, listed at most


def attention() -> dict[str, list[Item]]:
    """What needs a human, by kind, each bounded (oldest first where age matters)."""
    now = timezone.now()
    sessions = Session.objects.all()
    out: dict[str, list[Item]] = {}

    def of(qs: Any, kind: str, since_field: str, detail: Any) -> list[Item]:
        return [
            Item(kind, str(s.id), s.title or str(s.id), getattr(s, since_field, None), detail(s))
            for s in qs[:ATTENTION_LIMIT]
        ]

    out["blocked"] = of(
        sessions.filter(open_turn_seq__isnull=False, blocked_seq__isnull=False).order_by("last_event_at"),
        "blocked",
        "last_event_at",
        lambda s: {"blocked_seq": s.blocked_seq},
    )
    out["suspended"] = of(
        sessions.filter(suspended_seq__isnull=False).order_by("last_event_at"),
        "suspended",
        "last_event_at",
        lambda s: {"suspended_seq": s.suspended_seq},
    ) + [
        Item(
            "suspended",
            None,
            f"{s.scope} {s.target}".strip(),
            s.created_at,
            {"scope": s.scope, "target": s.target, "by": s.by, "reason": s.reason},
        )
        for s in Suspension.objects.order_by("created_at")
    ]
    out["revoked"] = of(
        sessions.filter(revoked_seq__isnull=False),
        "revoked",
        "last_event_at",
        lambda s: {"revoked_seq": s.revoked_seq},
    )
    held = list(sessions.filter(held_seq__isnull=False).order_by("last_event_at")[:ATTENTION_LIMIT])
    why = held_reasons([s.id for s in held])
    out["held_input"] = of(
        held,
        "held_input",
        "last_event_at",
        lambda s: {"held_seq": s.held_seq, "why": why.get(s.id, "held"), "suspended": s.suspended_seq is not None},
    )
    asked = list(
        Event.objects.filter(
            kind="approval/requested",
            session__pending_approvals__gt=0,
            session__open_turn_seq__isnull=False,
            seq__gte=F("session__open_turn_seq"),  # approvals of the open turn only
        )
        .select_related("session")
        .order_by("created_at")[:ATTENTION_LIMIT]
    )
    # A call decided already (its approval/resolved is in the open turn) waits no more, while another may.
    decided = set(
        Event.objects.filter(
            kind="approval/resolved",
            session_id__in={e.session_id for e in asked},
            seq__gte=F("session__open_turn_seq"),
        ).values_list("session_id", "data__call_id")
    )
    out["approvals"] = [
        Item(
            "approval",
            str(e.session_id),
            e.session.title or str(e.session_id),
            e.created_at,
            {"call_id": e.data["call_id"], "tool": e.data["name"], "seq": e.seq},
        )
        for e in asked
        if (e.session_id, e.data["call_id"]) not in decided
    ]
    expired = sessions.filter(open_turn_seq__isnull=False, lease_owner__gt="", lease_expires_at__lt=now)
    stale = sessions.filter(
        open_turn_seq__isnull=False,
        lease_owner="",
        pending_approvals=0,
        unknown_effects=0,
        blocked_seq__isnull=True,
        suspended_seq__isnull=True,
        last_event_at__lt=now - timedelta(seconds=settings.TERRET_LEASE_SECONDS * 2),
    )
    out["expired_leases"] = of(
        (expired | stale).order_by("last_event_at"),
        "expired_lease",
        "lease_expires_at",
        lambda s: {
            "lease_owner": s.lease_owner,
            "lease_expires_at": s.lease_expires_at.isoformat() if s.lease_expires_at else None,
        },
    )
    # Every turn's, not only the open one's: a cancelled or failed turn's
    # unknown effect stays here until an operator resolves it.
    unresolved = list(sessions.filter(unresolved_effects__gt=0).order_by("last_event_at")[:ATTENTION_LIMIT])
    calls = _unresolved_calls([s.id for s in unresolved])
    out["unknown_effects"] = [
        Item(
            "unknown_effects",
            str(s.id),
            s.title or str(s.id),
            s.last_event_at,
            {"pending": s.unresolved_effects, "open_turn": s.unknown_effects, "calls": calls.get(s.id, [])},
        )
        for s in unresolved
    ]
    out["effects_audit"] = [
        Item(
            "effects_audit",
            str(a.session_id),
            a.session.title or str(a.session_id),
            a.audited_at,
            {"problems": a.problems[:ATTENTION_CALLS], "found": a.found, "audited_seq": a.audited_seq},
        )
        for a in EffectAudit.objects.filter(found__gt=0)
        .select_related("session")
        .order_by("audited_at")[:ATTENTION_LIMIT]
    ]
    out["stalled"] = [
        _stalled_item(s) for s in sessions.filter(STALL_STANDS).order_by("last_event_at")[:ATTENTION_LIMIT]
    ]
    out["notifications"] = _notifications()
    out["stranded"] = _stranded()
    out["monitors"] = _monitor_items()
    out.update(_tasks())
    return out


# turn/blocked codes that only an upgrade, the code's return or an abandon moves on.
STRANDED_CODES = ("definition_missing", UNSUPPORTED_VERSION)


def _stranded() -> list[Item]:
    """Sessions a deploy left behind: blocked definition_missing or
    unsupported_version, and sessions pinned to a version naming built-in
    tools the running code no longer has. Their actions: upgrade (through
    the pre-flight) and abandon."""
    blocked = (
        Event.objects.filter(
            kind="turn/blocked",
            seq=F("session__blocked_seq"),
            session__open_turn_seq__isnull=False,
            data__code__in=STRANDED_CODES,
        )
        .select_related("session")
        .order_by("created_at")[:ATTENTION_LIMIT]
    )
    items = [
        Item(
            "stranded",
            str(e.session_id),
            e.session.title or str(e.session_id),
            e.created_at,
            {"code": e.data["code"], "what": e.data.get("what", ""), "reason": e.data.get("reason", "")},
        )
        for e in blocked
    ]
    items += _input_unread()[: ATTENTION_LIMIT - len(items)]
    seen = {item.session_id for item in items}
    return items + [i for i in _pinned_without_tools() if i.session_id not in seen][: ATTENTION_LIMIT - len(items)]


def _input_unread() -> list[Item]:
    """Idle sessions with input waiting for a turn whose log holds an event
    version no live worker reads: no turn is open to block, so the drive
    writes nothing (runtime/drive.py) and the state is read here, from the
    session row and the WorkerProcess rows. The listing clears itself once
    a worker that reads the log registers, and the sweep (owed) wakes the
    session for it. Two statements, like the sweep's, each on its own index."""
    idle = Session.objects.filter(
        open_turn_seq__isnull=True,
        event_versions__isnull=False,
        held_seq__isnull=True,
        suspended_seq__isnull=True,
        revoked_seq__isnull=True,
    )
    fields = ("id", "title", "event_versions", "last_event_at")
    rows = list(idle.filter(queued_follow_ups__gt=0).values_list(*fields)[:ATTENTION_LIMIT])
    woken = idle.filter(woken_steers__gt=0, last_input_seq__gt=F("inbox_seq"))
    rows += [r for r in woken.values_list(*fields)[:ATTENTION_LIMIT] if r[0] not in {x[0] for x in rows}]
    if not rows:
        return []
    # With no worker registered (the embedded worker of a single process
    # registers none), the reader is this process's own code.
    reads = [dict(r or {}) for r in WorkerProcess.objects.values_list("event_versions", flat=True)]
    reads = reads or [catalogue.versions()]
    items: list[Item] = []
    for session_id, title, written, at in sorted(rows, key=lambda r: r[3] or timezone.now()):
        what = _unread_by_all(codever.written_versions(written), reads)
        if what is None:
            continue
        reason = f"input waits for a turn, and no live worker reads {what.removeprefix('event:')}"
        detail = {"code": UNSUPPORTED_VERSION, "what": what, "reason": reason, "waiting": "input"}
        items.append(Item("stranded", str(session_id), title or str(session_id), at, detail))
    return items[:ATTENTION_LIMIT]


def _unread_by_all(written: dict[str, int] | None, reads: list[dict[str, int]]) -> str | None:
    """The first "event:<kind>@<version>" of `written` that keeps each reader
    of `reads` out; None when some reader reads all of it."""
    found = [catalogue.unreadable(written, r) for r in reads]
    return None if None in found else found[0]


def _pinned_without_tools() -> list[Item]:
    """Pinned sessions whose version names built-in tools this code lacks
    (one read of the versions the pinned sessions run, which are few)."""
    pinned = Session.objects.filter(profile__upgrade_policy="pinned", agent_version__isnull=False)
    runs = set(pinned.values_list("profile_id", "agent_version").distinct()[:ATTENTION_LIMIT])
    lacking: dict[tuple[int, int], list[str]] = {}
    for version in AgentVersion.objects.filter(profile_id__in={p for p, _ in runs}):
        if (version.profile_id, version.number) not in runs:
            continue
        gone = [t["name"] for t in version.snapshot.get("tools", []) if t.get("name") not in BUILTINS]
        if gone:
            lacking[(version.profile_id, version.number)] = gone
    items: list[Item] = []
    for (profile_id, number), gone in lacking.items():
        for s in pinned.filter(profile_id=profile_id, agent_version=number).order_by("last_event_at")[:ATTENTION_LIMIT]:
            what = f"tool:{gone[0]}"
            reason = f"pinned to version {number}, whose built-in tools {', '.join(gone)} the running code lacks"
            items.append(Item("stranded", str(s.id), s.title or str(s.id), s.last_event_at, {
                "code": "pinned_version", "what": what, "reason": reason, "version": number,
            }))  # fmt: skip
    return items[:ATTENTION_LIMIT]


def _tasks() -> dict[str, list[Item]]:
    """Owned tasks: the live ones (oldest first), the blocked ones (their kind
    or version missing from the running code), and orphans (live, but their
    owner is archived or revoked, their foreground turn has ended, or their
    supervisor's lease ran out): the reaper ends orphans within a round or
    two, so one that stays here is stuck."""
    now = timezone.now()
    live = Task.objects.filter(receipt_seq__isnull=True).select_related("session").order_by("created_at")
    gone = Q(session__archived_at__isnull=False) | Q(session__revoked_seq__isnull=False)
    ended = Q(background=False) & (Q(session__open_turn_seq__isnull=True) | ~Q(session__open_turn_seq=F("turn_seq")))
    unowned = Q(phase__in=("running", "completing")) & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))

    def items(qs: Any, kind: str) -> list[Item]:
        return [
            Item(kind, str(t.session_id), t.session.title or str(t.session_id), t.started_at or t.created_at, {
                "task": task_json(t),
            })
            for t in qs[:ATTENTION_LIMIT]
        ]  # fmt: skip

    return {
        "tasks_live": items(live.exclude(phase="blocked"), "task"),
        "tasks_blocked": items(live.filter(phase="blocked"), "task_blocked"),
        "tasks_orphaned": items(live.filter(gone | ended | unowned), "task_orphaned"),
    }


def _stalled_item(session: Session) -> Item:
    """A running turn with no progress for TERRET_STALL_SECONDS (its
    turn/stalled stands): since when, and what it was doing."""
    shown = turn_progress(session)
    return Item("stalled", str(session.id), session.title or str(session.id), stalled_since(session), shown.as_json())


def _unresolved_calls(session_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """Each session's attempts marked unknown that no tool/resolved has
    answered yet, oldest first, at most ATTENTION_CALLS each: one read of
    those sessions' tool/unknown and tool/resolved events (index on
    session, kind, seq), which are few."""
    rows = (
        Event.objects.filter(session_id__in=session_ids, kind__in=("tool/unknown", "tool/resolved"))
        .order_by("session_id", "seq")
        .values_list("session_id", "seq", "kind", "data")
    )
    pending: dict[uuid.UUID, dict[tuple[str, int], dict[str, Any]]] = {}
    for session_id, seq, kind, data in rows:
        key = (data["call_id"], data["attempt"])
        mine = pending.setdefault(session_id, {})
        if kind == "tool/unknown":
            mine[key] = {"call_id": key[0], "attempt": key[1], "tool": data.get("name", ""), "seq": seq}
        else:
            mine.pop(key, None)
    return {sid: list(calls.values())[:ATTENTION_CALLS] for sid, calls in pending.items()}


def _notifications() -> list[Item]:
    """Notifications nobody will send by themselves: failed (the attempts ran
    out) or unknown (the sender stopped mid-send); the admin's "send again"
    takes them (docs/notifications.md)."""
    rows = (
        Notification.objects.filter(status__in=("failed", "unknown"))
        .select_related("session", "recipient")
        .order_by("created_at")[:ATTENTION_LIMIT]
    )
    return [
        Item(
            "notification",
            str(n.session_id),
            n.session.title or str(n.session_id),
            n.created_at,
            {
                "id": n.pk,
                "name": n.name,
                "seq": n.seq,
                "channel": n.channel,
                "status": n.status,
                "recipient": n.recipient.get_username(),
                "attempts": n.attempts,
                "error": n.last_error,
            },
        )
        for n in rows
    ]


def _monitor_items() -> list[Item]:
    """Monitors that need a human: a source partition whose last scan was
    failed or partial, an edition of unknown outcome, a held edition."""
    found = monitors.attention()
    items = [
        Item(
            "monitor_coverage",
            c["session_id"],
            f"monitor {c['monitor_id'][:8]}: {c['source']} [{c['partition']}] {c['coverage']}",
            None,
            {"reason": c["error"], "monitor_id": c["monitor_id"]},
        )
        for c in found["coverage"]
    ]
    for kind in ("unknown", "held"):
        for e in found[kind]:
            items.append(
                Item(
                    f"monitor_{kind}",
                    e["session_id"],
                    f"monitor {e['monitor_id'][:8]}: edition of period {e['period']} {kind}",
                    None,
                    {"reason": e["reason"], "monitor_id": e["monitor_id"], "edition_id": e["id"]},
                )
            )
    return items[:ATTENTION_LIMIT]
