"""Writes: session and agent lifecycle, admission of input, cancel, model roles.

Each `do`-style function validates, then takes the session row lock (log.locked)
for the check-then-act, appends, and leaves external effects (task dispatch,
group sends) to run on commit.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from approvals_app.selectors import pending_from_events
from sessions_app import log
from sessions_app.errors import (
    AgentBusy,
    AgentCapExceeded,
    AgentExists,
    IdempotencyConflict,
    InvalidInput,
    TurnAlreadyRunning,
    TurnOpenInLog,
)
from sessions_app.events import MODEL_ROLES
from sessions_app.models import Agent, AgentProfile, InputReceipt, Session
from sessions_app.runtime import dispatch
from sessions_app.selectors import pending_inputs, turn_events

MAX_INPUT_CHARS = 100_000


# ---------------------------------------------------------------- agents


def create_session(owner: Any, profile: AgentProfile, *, agent_id: str | None = None) -> Session:
    """A new session with its live agent spawned from `profile`."""
    with transaction.atomic():
        session = Session.objects.create(owner=owner, profile=profile)
        spawn_agent(session, profile, agent_id=agent_id)
    return session


def spawn_agent(session: Session, profile: AgentProfile, *, agent_id: str | None = None) -> Agent:
    agent_id = agent_id or f"{profile.name}-{session.id.hex[:12]}"
    with transaction.atomic():
        _lock_registry()
        if Agent.objects.filter(agent_id=agent_id).exists():
            raise AgentExists(f"agent id {agent_id!r} is taken")
        existing = Agent.objects.filter(session=session).first()
        if existing is not None:
            raise AgentExists(f"session {session.id} already has agent {existing.agent_id!r}")
        if Agent.objects.count() >= settings.TERRET_MAX_AGENTS:
            raise AgentCapExceeded(f"the registry is full ({settings.TERRET_MAX_AGENTS} live agents)")
        agent = Agent.objects.create(agent_id=agent_id, session=session, profile=profile)
        if session.profile_id != profile.pk:
            Session.objects.filter(id=session.id).update(profile=profile)
        log.append(session.id, "agent/spawned", {"agent_id": agent_id, "profile": profile.name})
    return agent


def _lock_registry() -> None:
    # The cap is a check-then-act across rows: serialize spawns. SQLite's
    # IMMEDIATE transactions already serialize every writer.
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [0x7E44E7])


def dispose_agent(agent_id: str) -> None:
    """Dispose an idle agent and free its registry slot."""
    agent = Agent.objects.filter(agent_id=agent_id).first()
    if agent is None:
        raise InvalidInput(f"no agent {agent_id!r}")
    with log.locked(agent.session_id) as tx:
        if tx.row["open_turn_seq"] is not None or _lease_live(tx.row):
            raise AgentBusy(f"agent {agent_id!r} is not idle")
        Agent.objects.filter(pk=agent.pk).delete()
        tx.append("agent/disposed", {"agent_id": agent_id})


def _lease_live(row: dict[str, Any]) -> bool:
    expires = row["lease_expires_at"]
    return bool(row["lease_owner"]) and expires is not None and expires > timezone.now()


# ---------------------------------------------------------------- turns


def resumable(session_id: uuid.UUID | str) -> bool:
    """A turn/start with no turn/end after it."""
    return Session.objects.filter(id=session_id, open_turn_seq__isnull=False).exists()


def _check_text(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("text must be a non-empty string")
    if "\x00" in text:
        raise InvalidInput("text must not contain NUL characters")
    if len(text) > MAX_INPUT_CHARS:
        raise InvalidInput(f"text is longer than {MAX_INPUT_CHARS} characters")
    return text


def _open_turn(tx: log.SessionTx, text: str | None, by: str) -> int:
    """turn/start, then whatever input was queued, then the new text.
    Queued input goes first so the projection keeps arrival order."""
    start = tx.append("turn/start", {"by": by} if by else {})
    # The inbox cursor says whether anything is queued, without a read.
    queued = (
        pending_inputs(tx.session_id, tx.row["inbox_seq"]) if tx.row["last_input_seq"] > tx.row["inbox_seq"] else []
    )
    for item in queued:
        kind = "user/message" if text is None and item.data.get("wake") else "context/injected"
        tx.append(kind, {"text": item.data["text"], "source_seq": item.seq})
        if kind == "user/message":
            text = ""  # the first woken item opened the turn; the rest ride along
    if text:
        tx.append("user/message", {"text": text})
    return start.seq


def run_turn(session_id: uuid.UUID | str, text: str, *, by: str = "") -> int:
    """Open a turn with `text` as input and wake a worker. Returns the turn/start seq.

    Raises TurnAlreadyRunning when the agent is mid-turn (running or parked),
    and TurnOpenInLog when the agent is idle but the log holds an open turn
    (a crashed one): that turn must be resumed, never shadowed by a second
    turn/start. Appends nothing in either case.
    """
    _check_text(text)
    with log.locked(session_id) as tx:
        _refuse_if_open(tx)
        turn_seq = _open_turn(tx, text, by)
        dispatch.wake(tx.session_id)
    return turn_seq


def _refuse_if_open(tx: log.SessionTx) -> None:
    if tx.row["open_turn_seq"] is None:
        return
    if tx.row["pending_approvals"] > 0 or _lease_live(tx.row):
        raise TurnAlreadyRunning(f"session {tx.session_id} is mid-turn")
    raise TurnOpenInLog(f"session {tx.session_id} has an open turn in its log; resume it")


@dataclass(frozen=True)
class Receipt:
    disposition: Literal["started", "queued"]
    seq: int
    turn_seq: int | None
    idempotency_key: str | None = None
    replayed: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "disposition": self.disposition,
            "seq": self.seq,
            "turn_seq": self.turn_seq,
            "idempotency_key": self.idempotency_key,
            "replayed": self.replayed,
        }


def _digest(text: str, wake: bool) -> str:
    return hashlib.sha256(json.dumps([text, wake]).encode()).hexdigest()


def inject(
    session_id: uuid.UUID | str, text: str, *, wake: bool = False, by: str = "", idempotency_key: str | None = None
) -> Receipt:
    """Admit input. On an idle agent with wake=True it opens a turn
    ("started"); otherwise it is queued durably and rides the next step of the
    running turn, or the next turn ("queued").

    Two wakes racing on an idle agent serialize on the row lock: the first
    opens the turn, the second finds it open and queues, so there is exactly
    one turn/start and no text is dropped.
    """
    _check_text(text)
    if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > 200):
        raise InvalidInput("idempotency key must be 1..200 characters")
    if wake and idempotency_key is None:
        receipt = _start_if_idle(session_id, text, by)
        if receipt is not None:
            return receipt
    digest = _digest(text, wake)
    with log.locked(session_id) as tx:
        if idempotency_key is not None:
            prior = InputReceipt.objects.filter(session_id=tx.session_id, key=idempotency_key).first()
            if prior is not None:
                if prior.digest != digest:
                    raise IdempotencyConflict("this idempotency key was used with a different payload")
                return Receipt(prior.disposition, prior.seq, prior.turn_seq, idempotency_key, True)  # type: ignore[arg-type]
        if wake and tx.row["open_turn_seq"] is None:
            turn_seq = _open_turn(tx, text, by)
            receipt = Receipt("started", tx.appended[-1].seq, turn_seq, idempotency_key)
        else:
            data: dict[str, Any] = {"text": text, "wake": wake}
            if by:
                data["by"] = by
            if idempotency_key:
                data["idempotency_key"] = idempotency_key
            event = tx.append("input/queued", data)
            receipt = Receipt("queued", event.seq, tx.row["open_turn_seq"], idempotency_key)
        if idempotency_key is not None:
            InputReceipt.objects.create(
                session_id=tx.session_id,
                key=idempotency_key,
                digest=digest,
                disposition=receipt.disposition,
                seq=receipt.seq,
                turn_seq=receipt.turn_seq,
            )
        if wake or receipt.disposition == "started":
            dispatch.wake(tx.session_id)
    return receipt


def _start_if_idle(session_id: uuid.UUID | str, text: str, by: str) -> Receipt | None:
    """The common admission, a wake on an idle agent with nothing queued, as
    one guarded statement: the UPDATE's row lock decides "idle" and writes
    turn/start + user/message, so no transaction is held open around a
    separate read. None (nothing written) when the agent is not idle or input
    is queued; the caller then takes the locked path, which handles both."""
    items: list[tuple[str, dict[str, Any]]] = [
        ("turn/start", {"by": by} if by else {}),
        ("user/message", {"text": text}),
    ]
    events = log.append_many(session_id, items, guard="idle_empty_inbox")
    if not events:
        return None
    dispatch.wake(events[0].session_id)
    return Receipt("started", events[-1].seq, events[0].seq, None)


def cancel(session_id: uuid.UUID | str, *, by: str = "") -> bool:
    """Cancel the open turn: mark it cancelled first, then deny every standing
    approval request, in that order, so a parked call unparks into a turn that
    already knows it is stopping. The turn ends cancelled at a step boundary.
    Returns False when there is no open turn."""
    with log.locked(session_id) as tx:
        turn_seq = tx.row["open_turn_seq"]
        if turn_seq is None:
            return False
        events = turn_events(tx.session_id, turn_seq)
        if not any(e.kind == "turn/cancel_requested" for e in events):
            tx.append("turn/cancel_requested", {"by": by} if by else {})
        for call in pending_from_events(events):
            data = {"call_id": call.call_id, "verdict": "deny", "reason": "turn cancelled"}
            if by:
                data["by"] = by
            tx.append("approval/resolved", data)
        dispatch.wake(tx.session_id)
    return True


def set_model(session_id: uuid.UUID | str, role: str, spec: str, *, by: str = "") -> log.AppendedEvent:
    """Repoint a model role for this session, in force from the next step."""
    if role not in MODEL_ROLES:
        raise InvalidInput(f"role must be one of {', '.join(MODEL_ROLES)}")
    if not isinstance(spec, str) or not spec.strip() or len(spec) > 200:
        raise InvalidInput("spec must be a non-empty model name")
    data = {"role": role, "spec": spec.strip()}
    if by:
        data["by"] = by
    return log.append(session_id, "model/updated", data)
