"""Which allow-list patterns are in force for a session, and their history.

The log is the only source of truth: the active patterns are those of the
session's last policy/updated event, or, failing that, the profile's floor.

A read-through cache per session keeps the event's patterns in memory, keyed
by the seq of that event. Every lookup first learns Session.policy_seq (a
projection column the append transaction maintains, so it moves in the same
commit as the event): read from the row, or, from a turn runner, as of its
own latest commit (runtime/outbox.py says why that is enough); a
cached entry is used only while it names that same seq. An update made by
any process is therefore in force at the very next tool call everywhere,
and the cache can never disagree with the log. The
policy/updated listener refreshes this process's entry eagerly on commit.

A session that cannot be read fails closed: every tool is denied, a warning
is logged, and that answer is never cached.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

from django.db import DatabaseError

from policies_app.patterns import allowed, pattern_error
from sessions_app.log.reads import policy_row
from sessions_app.models import AgentProfile, Event, Session

logger = logging.getLogger(__name__)

Source = Literal["session", "floor", "closed"]
HISTORY_LIMIT = 50
CACHE_MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class ActivePolicy:
    patterns: tuple[str, ...]
    source: Source  # session: a policy/updated event; floor: the profile; closed: unreadable
    seq: int | None = None  # the policy/updated event in force

    def allows(self, tool_name: str) -> bool:
        return self.source != "closed" and allowed(tool_name, self.patterns)


CLOSED = ActivePolicy((), "closed")


class _Cache:
    """session id -> the ActivePolicy of the policy/updated event at `seq`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[uuid.UUID, ActivePolicy] = {}

    def get(self, sid: uuid.UUID, seq: int) -> ActivePolicy | None:
        with self._lock:
            entry = self._entries.get(sid)
        return entry if entry is not None and entry.seq == seq else None

    def put(self, sid: uuid.UUID, policy: ActivePolicy) -> None:
        if policy.source != "session" or policy.seq is None:
            return  # only log-backed answers are cached; never a fail-closed one
        with self._lock:
            current = self._entries.get(sid)
            if current is not None and (current.seq or 0) >= policy.seq:
                return  # a newer policy is already known
            if len(self._entries) >= CACHE_MAX_SESSIONS:
                self._entries.clear()  # crude bound; entries are cheap to re-read
            self._entries[sid] = policy

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


cache = _Cache()


def _from_patterns(sid: uuid.UUID, raw: Any, source: Source, seq: int | None) -> ActivePolicy:
    if not isinstance(raw, list):
        logger.warning("session %s: %s patterns are not a list; denying every tool", sid, source)
        return ActivePolicy((), source, seq)
    good = tuple(p for p in raw if pattern_error(p) is None)
    if len(good) != len(raw):
        # An invalid pattern allows nothing (fail closed for it alone).
        logger.warning("session %s: ignoring invalid %s patterns %r", sid, source, [p for p in raw if p not in good])
    return ActivePolicy(good, source, seq)


def policy_from_event(sid: uuid.UUID, seq: int, data: dict[str, Any]) -> ActivePolicy:
    return _from_patterns(sid, data.get("patterns"), "session", seq)


_READ = object()


def current_policy(
    session_id: uuid.UUID | str, profile: AgentProfile | None = None, *, known_seq: int | object | None = _READ
) -> ActivePolicy:
    """The policy in force right now. `profile` (the turn's) supplies the
    floor; without it the session's profile is read. A turn runner passes
    `known_seq`, the session's policy_seq as of its own latest commit (None:
    no policy/updated yet), which saves reading the session row."""
    try:
        sid = uuid.UUID(str(session_id))
        if known_seq is not _READ:
            return _for_seq(sid, cast(int | None, known_seq), profile, None)
        return _current(sid, profile)
    except (DatabaseError, ValueError, KeyError, TypeError):
        logger.warning("policy of session %s could not be read; denying every tool", session_id, exc_info=True)
        return CLOSED


def _current(sid: uuid.UUID, profile: AgentProfile | None) -> ActivePolicy:
    # By primary key, a fixed statement of the log's: every caller that does
    # not know the policy in force (a turn runner does) reads it here.
    found = policy_row(sid)
    if found is None:
        logger.warning("policy of unknown session %s requested; denying every tool", sid)
        return CLOSED
    return _for_seq(sid, found[0], profile, found[1])


def _for_seq(sid: uuid.UUID, seq: int | None, profile: AgentProfile | None, profile_id: Any) -> ActivePolicy:
    if seq is None:
        if profile is None:
            pk = profile_id
            if pk is None:
                pk = Session.objects.filter(id=sid).values_list("profile_id", flat=True).first()
            profile = AgentProfile.objects.filter(pk=pk).first()
        floor = profile.allow_floor if profile is not None else []
        return _from_patterns(sid, floor, "floor", None)
    cached = cache.get(sid, seq)
    if cached is not None:
        return cached
    event = Event.objects.filter(session_id=sid, seq=seq).values_list("kind", "data").first()
    if event is None or event[0] != "policy/updated":
        logger.warning("session %s: policy_seq %s names no policy/updated event; denying every tool", sid, seq)
        return CLOSED
    policy = policy_from_event(sid, seq, event[1])
    cache.put(sid, policy)
    return policy


def current_patterns(session_id: uuid.UUID | str, profile: AgentProfile | None = None) -> list[str] | None:
    """The active patterns, or None when the session cannot be read (deny everything)."""
    policy = current_policy(session_id, profile)
    return None if policy.source == "closed" else list(policy.patterns)


@dataclass(frozen=True)
class PolicyChange:
    seq: int
    patterns: list[str]
    by: str
    at: datetime


def history(session_id: uuid.UUID | str, limit: int = HISTORY_LIMIT) -> list[PolicyChange]:
    """The session's policy/updated events, newest first (at most `limit`)."""
    limit = max(1, min(limit, 500))
    rows = (
        Event.objects.filter(session_id=session_id, kind="policy/updated")
        .order_by("-seq")
        .values_list("seq", "data", "created_at")[:limit]
    )
    return [PolicyChange(seq, list(data.get("patterns") or []), data.get("by", ""), at) for seq, data, at in rows]
