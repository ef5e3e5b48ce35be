"""Forks: a new session from a point of another one's log.

The log is append-only, so the past is never rewritten: going back means
starting a new session (the *child*) whose log opens with a copy of the
parent's model-visible history as of a seq, `at_seq`. docs/events.md
("Forks") is the reference; in short:

- **Fork points.** `at_seq` is a fork point when no step is open as of it:
  the newest of the turn/start, turn/end, step/start and step/end events at
  or before it is not a step/start. So: anywhere between turns, and inside
  a turn only at its opening (turn/start and the input it took in) or right
  after a step/end. Inside a step the parent had a model reply on its way,
  calls owed results or parked on a verdict; none of that is copied, so a
  fork never starts there. In a fork, its seed (seqs 1..seed_upto, one
  commit) is forkable only as a whole, at seed_upto.
- **Refusals.** Any other seq is refused with InvalidForkPoint naming the
  nearest fork points before and after it, except a seq inside the step that
  is still open at the parent's head (the parent is mid-step now): its end is
  not written yet, so the fork takes the last fork point before it and
  session/forked records the seq asked for (`requested_seq`).
- **The child** is owned by the requester (who must be able to read the
  parent), on the parent's profile, idle, with no budget of its own set and
  nothing spent. Its seed, written in one commit: session/forked, the copied
  history, then the policy and model roles its inheritance policy gives it.
- **Inheritance.** historical: the policy, model roles and documents in
  force as of at_seq; current: the parent's as of now; fresh: the profile's
  floor and roles and no documents. Never: effects (no tool/attempt is
  copied), schedules, tokens, budgets or spend, approvals (parked or granted
  for the session: a policy's auto_approve stays with the parent).
- **Holds.** A session an operator revoked or suspended is not forked
  (SessionRevoked, NotAllowed) until restored or resumed: a fork must not
  escape the hold.
- **The parent** gets one session/forked_to, appended under its row lock in
  the same transaction as the child's seed, so every fork of it is ordered
  among its events; nothing else of it changes.

On a message: `edit_and_resend` forks just before a user/message and sends
the edited text; `regenerate` forks at the turn/start of a reply's turn and
opens that turn again with the same input (a turn must open with input).

Documents (the workspace among them, runtime/documents.py): copied as rows
inside the fork's transaction, under the parent's row lock: historical
takes the conversation documents' versions whose seqs are at or before
at_seq, exactly; current takes the parent's as they stand at admission;
fresh none; session-scoped documents come as they stand under either
policy, task-scoped ones never. Contents are shared by hash, not copied.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from sessions_app import log
from sessions_app.errors import (
    InvalidForkPoint,
    InvalidInput,
    NotAllowed,
    SessionRevoked,
    TurnAlreadyRunning,
    UnknownSession,
)
from sessions_app.log.catalogue import MODEL_ROLES, MODEL_VISIBLE
from sessions_app.log.projection import latest_compaction
from sessions_app.log.reads import latest_seq_of
from sessions_app.models import Event, Session
from sessions_app.permissions import can_view
from sessions_app.runtime import admission, dispatch, documents
from sessions_app.services.inputs import Receipt, inject

logger = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("historical", "current", "fresh")
MARKERS = ("turn/start", "turn/end", "step/start", "step/end")
Items = list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Point:
    """The fork point used, and the seq asked for when it was taken back."""

    at_seq: int
    requested: int

    @property
    def moved(self) -> bool:
        return self.at_seq != self.requested


# ---------------------------------------------------------------- fork points


def seed_upto(session_id: uuid.UUID) -> int:
    """The last seq of a fork's seed (0: the session is no fork)."""
    first = Event.objects.filter(session_id=session_id, seq=1).values_list("kind", "data").first()
    if first is None or first[0] != "session/forked":
        return 0
    return int(first[1]["seed_upto"])


def _markers_before(session_id: uuid.UUID, seq: int, limit: int = 64) -> list[tuple[int, str]]:
    rows = (
        Event.objects.filter(session_id=session_id, kind__in=MARKERS, seq__lte=seq)
        .order_by("-seq")
        .values_list("seq", "kind")[:limit]
    )
    return list(rows)


def _step_open_at(session_id: uuid.UUID, seq: int) -> int | None:
    """The step/start of the step open as of `seq` (the first of a run, since
    a resumed step may start again), or None when no step is open."""
    markers = _markers_before(session_id, seq)
    if not markers or markers[0][1] != "step/start":
        return None
    first = markers[0][0]
    for marker_seq, kind in markers:
        if kind != "step/start":
            break
        first = marker_seq
    return first


def _step_closed_after(session_id: uuid.UUID, seq: int) -> int | None:
    row = (
        Event.objects.filter(session_id=session_id, kind__in=("step/end", "turn/end"), seq__gt=seq)
        .order_by("seq")
        .values_list("seq", flat=True)
        .first()
    )
    return int(row) if row is not None else None


def last_point(session_id: uuid.UUID, seq: int) -> int:
    """The last fork point at or before `seq` (seq itself if it is one)."""
    start = _step_open_at(session_id, seq)
    return seq if start is None else start - 1


def resolve_point(session_id: uuid.UUID, at_seq: int, head: int) -> Point:
    """`at_seq` as a fork point of the session (head: its last_seq), by the
    rule in the module docstring; InvalidForkPoint when it is none."""
    floor = max(seed_upto(session_id), 1)
    if at_seq < floor:
        where = "inside this fork's seed, which forks only as a whole" if at_seq >= 1 else "before the log's start"
        raise InvalidForkPoint(
            f"seq {at_seq} is {where}; the nearest fork point is {floor}", at_seq=at_seq, before=None, after=floor
        )
    if at_seq > head:
        before = last_point(session_id, head)
        raise InvalidForkPoint(
            f"seq {at_seq} is past the log's head ({head}); the nearest fork point is {before}",
            at_seq=at_seq,
            before=before,
            after=None,
        )
    start = _step_open_at(session_id, at_seq)
    if start is None:
        return Point(at_seq, at_seq)
    after = _step_closed_after(session_id, at_seq)
    if after is None:  # the step is still open at the head: the parent is mid-step now
        return Point(start - 1, at_seq)
    raise InvalidForkPoint(
        f"seq {at_seq} is inside a step (its step/start is {start}, its end {after}); "
        f"fork at {start - 1} (before the step) or {after} (after it)",
        at_seq=at_seq,
        before=start - 1,
        after=after,
    )


# ---------------------------------------------------------------- the seed


def _copied(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """A model-visible event as the child's log holds it: what the model
    sees, without the parent's bookkeeping (input cursors, usage, attempts)."""
    if kind in ("user/message", "context/injected"):
        return {"text": data["text"]}
    if kind == "assistant/message":
        return {k: data[k] for k in ("content", "tool_calls", "partial") if k in data}
    if kind == "tool/result":
        return {k: data[k] for k in ("call_id", "name", "content", "is_error", "via") if k in data}
    return dict(data)


def _first_user_text(session_id: uuid.UUID, before: int) -> str | None:
    row = (
        Event.objects.filter(session_id=session_id, kind="user/message", seq__lt=before)
        .order_by("seq")
        .values_list("data", flat=True)
        .first()
    )
    return None if row is None else str(row.get("text") or "")


def history_items(session_id: uuid.UUID, at_seq: int) -> Items:
    """The parent's model-visible history as of at_seq, as the child's
    events from seq 2 on (after its session/forked): from the latest
    compaction at or before at_seq (preceded by the session's first user
    message, which the summary hides but compaction's Task block reads),
    then every model-visible event after it."""
    items: Items = []
    after = 0
    compaction = latest_compaction(session_id, at_seq)
    if compaction is not None:
        after, data = compaction
        task = _first_user_text(session_id, after)
        if task is not None:
            items.append(("user/message", {"text": task}))
        # upto_seq: the child's seq just before it (session/forked is seq 1).
        items.append(("session/compacted", {"upto_seq": len(items) + 1, "summary": data["summary"]}))
    rows = (
        Event.objects.filter(session_id=session_id, seq__gt=after, seq__lte=at_seq, kind__in=MODEL_VISIBLE)
        .exclude(kind="session/compacted")
        .order_by("seq")
        .values_list("kind", "data")
    )
    items.extend((kind, _copied(kind, data)) for kind, data in rows)
    _check_answered(items, at_seq)
    return items


def _check_answered(items: Items, at_seq: int) -> None:
    """Every copied call has its result: true at a fork point by the rule;
    checked, because a provider refuses a history that breaks it."""
    owed: set[str] = set()
    for kind, data in items:
        if kind == "assistant/message":
            owed |= {c["id"] for c in data.get("tool_calls") or []}
        elif kind == "tool/result":
            owed.discard(data["call_id"])
    if owed:
        raise InvalidForkPoint(f"seq {at_seq} leaves calls without results", at_seq=at_seq, before=None, after=None)


def _latest(session_id: uuid.UUID, kind: str, upto: int, **match: Any) -> dict[str, Any] | None:
    qs = Event.objects.filter(session_id=session_id, kind=kind, seq__lte=upto, **match)
    return qs.order_by("-seq").values_list("data", flat=True).first()


def inherited(
    session_id: uuid.UUID, point: int, policy: str, row: dict[str, Any]
) -> tuple[list[str] | None, dict[str, str]]:
    """The allow-list patterns (None: the profile's floor) and model roles
    the child gets: as of `point`, as of now (`row`: the parent's row under
    its lock), or none."""
    if policy == "fresh":
        return None, {}
    if policy == "current":
        upto, roles = int(row["last_seq"]), {r: row[f"model_{r}"] for r in MODEL_ROLES if row[f"model_{r}"]}
    else:
        upto, roles = point, {}
        for role in MODEL_ROLES:
            found = _latest(session_id, "model/updated", point, data__role=role)
            if found is not None:
                roles[role] = found["spec"]
    policy_event = _latest(session_id, "policy/updated", upto)
    return (None if policy_event is None else list(policy_event["patterns"])), roles


def seed_items(parent: uuid.UUID, point: Point, policy: str, row: dict[str, Any], *, by: str) -> Items:
    """The child's whole seed, session/forked first."""
    history = history_items(parent, point.at_seq)
    patterns, roles = inherited(parent, point.at_seq, policy, row)
    tail: Items = []
    if patterns is not None:
        tail.append(("policy/updated", {"patterns": patterns, "by": by}))
    tail.extend(("model/updated", {"role": role, "spec": spec, "by": by}) for role, spec in roles.items())
    if row["title"]:
        tail.append(("session/titled", {"title": (row["title"][:73] + " (fork)")}))
    forked: dict[str, Any] = {
        "parent": str(parent),
        "at_seq": point.at_seq,
        "policy": policy,
        "seed_upto": 1 + len(history) + len(tail),
        "by": by,
    }
    if point.moved:
        forked["requested_seq"] = point.requested
    return [("session/forked", forked), *history, *tail]


# ---------------------------------------------------------------- the fork


def _parent_for(session_id: Any, user: Any) -> Session:
    try:
        sid = uuid.UUID(str(session_id))
    except ValueError:
        raise UnknownSession(f"no session {str(session_id)[:64]!r}") from None
    session = Session.objects.filter(id=sid).first()
    if session is None or not can_view(user, session):
        raise UnknownSession(f"no session {sid}")  # one you may not read answers like a missing one
    return session


def _check_args(at_seq: Any, policy: Any) -> None:
    if isinstance(at_seq, bool) or not isinstance(at_seq, int):
        raise InvalidInput("at_seq must be an integer")
    if policy not in POLICIES:
        raise InvalidInput(f"policy must be one of {', '.join(POLICIES)}")


def _refuse_held(row: dict[str, Any]) -> None:
    """An operator's hold on the parent is not escaped by forking it."""
    if row["revoked_seq"] is not None:
        raise SessionRevoked(f"session {row['id']} is revoked; a staff member must restore it before it is forked")
    if row["suspended_seq"] is not None:
        raise NotAllowed(f"session {row['id']} is suspended by an operator; it is forked once resumed")


def fork(session_id: Any, at_seq: int, policy: str, *, user: Any) -> Session:
    """A new session of `user`'s from the parent's log as of at_seq (module
    docstring). Raises UnknownSession (no such session, or one `user` may
    not read), InvalidInput, InvalidForkPoint; nothing is written then."""
    _check_args(at_seq, policy)
    parent = _parent_for(session_id, user)
    point = resolve_point(parent.id, at_seq, parent.last_seq)
    by = str(user.get_username())
    child_id = uuid.uuid4()
    with log.locked(parent.id) as tx:
        _refuse_held(tx.row)
        items = seed_items(parent.id, point, policy, tx.row, by=by)
        Session.objects.create(id=child_id, owner=user, profile_id=tx.row["profile_id"])
        log.append_many(child_id, items)
        # Under the parent's row lock, which every document write takes: the
        # copy is exactly as of at_seq, or exactly the parent's at admission.
        documents.copy_for_fork(parent.id, child_id, at_seq=point.at_seq, policy=policy, row_seq=tx.row["last_seq"])
        tx.append("session/forked_to", {"child": str(child_id), "at_seq": point.at_seq, "policy": policy, "by": by})
    return Session.objects.select_related("profile").get(id=child_id)


def as_json(child: Session) -> dict[str, Any]:
    """A fork as the API and the socket answer it: the new session, and
    where it came from (its session/forked)."""
    origin = forked_from(child.id) or {}
    return {
        "id": str(child.id),
        "profile": child.profile.name if child.profile else None,
        "status": child.status,
        "parent": origin.get("parent"),
        "at_seq": origin.get("at_seq"),
        "requested_seq": origin.get("requested_seq"),
        "policy": origin.get("policy"),
        "last_seq": child.last_seq,
    }


def forked_from(session_id: uuid.UUID) -> dict[str, Any] | None:
    """The session/forked payload of a fork (None: no fork)."""
    first = Event.objects.filter(session_id=session_id, seq=1).values_list("kind", "data").first()
    return first[1] if first is not None and first[0] == "session/forked" else None


def forks_of(session_id: uuid.UUID, limit: int = 200) -> list[dict[str, Any]]:
    """The session's forks (session/forked_to payloads), oldest first."""
    rows = Event.objects.filter(session_id=session_id, kind="session/forked_to").order_by("seq")
    return list(rows.values_list("data", flat=True)[:limit])


# ---------------------------------------------------------------- on a message


def _event(session_id: uuid.UUID, seq: Any, kind: str) -> None:
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise InvalidInput("seq must be an integer")
    if not Event.objects.filter(session_id=session_id, seq=seq, kind=kind).exists():
        raise InvalidInput(f"seq {seq} is not a {kind} of this session")


def edit_and_resend(
    session_id: Any, message_seq: int, text: str, *, user: Any, policy: str = "historical"
) -> tuple[Session, Receipt]:
    """Fork just before the user/message at message_seq and send `text` in
    its place: the fork's first turn answers the edited message."""
    parent = _parent_for(session_id, user)
    _event(parent.id, message_seq, "user/message")
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("text must be a non-empty string")  # checked before the fork is made
    child = fork(parent.id, message_seq - 1, policy, user=user)
    return child, inject(child.id, text, wake=True, by=str(user.get_username()))


def regenerate(session_id: Any, reply_seq: int, *, user: Any, policy: str = "historical") -> Session:
    """Ask the model again for the assistant/message at reply_seq: fork just
    before the step that produced it and open a turn that takes in no input
    (`turn/start {regenerate: true}`), so the model's request sees exactly
    the messages it saw for that step, of the turn's first step or of a later
    one after its tool results alike."""
    parent = _parent_for(session_id, user)
    _event(parent.id, reply_seq, "assistant/message")
    step_seq = latest_seq_of(parent.id, "step/start", at_or_before=reply_seq - 1)
    if step_seq is None:
        raise InvalidInput(f"seq {reply_seq} belongs to no step")
    child = fork(parent.id, int(step_seq) - 1, policy, user=user)
    wake_again(child.id, by=str(user.get_username()))
    return child


def wake_again(session_id: uuid.UUID, *, by: str) -> int:
    """Open a turn on the idle fork that answers its history as it stands,
    and wake a worker; the turn/start seq."""
    with log.locked(session_id) as tx:
        if tx.row["open_turn_seq"] is not None:
            raise TurnAlreadyRunning(f"session {session_id} is mid-turn")
        data: dict[str, Any] = {"regenerate": True}
        if by:
            data["by"] = by
        try:
            start, _ = admission.open_versioned(tx, data)
        except log.TurnAlreadyOpen as exc:  # the log's own refusal, behind the check above
            raise TurnAlreadyRunning(f"session {session_id} is mid-turn") from exc
        dispatch.wake(session_id)
    return start.seq
