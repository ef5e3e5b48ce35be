"""Titling: every session gets exactly one session/titled, at its first turn/end.

The titler model role writes the title when it is configured (and answers);
otherwise the title is the first user message, whitespace collapsed and
truncated to 40 characters. Whatever the source, the stored title is capped
at 80 characters. session/titled is metadata: never model-visible.

Exactly one, even with concurrent workers or a retried task: the model call
happens outside any lock, then the decision is check-then-append under the
session row lock (the `title` projection column is non-empty once a
session/titled exists); without titler usage to record it is one guarded
append whose UPDATE only matches an untitled row. A loser of that race
appends no title, but still records the titler's usage: the spend happened.

A session whose first turn carried no user text (an "empty" turn) is titled
at the first turn/end that follows some user text.
"""

from __future__ import annotations

import logging
import re
import uuid

from django.db import connection

from sessions_app import log
from sessions_app.llm.registry import complete_utility
from sessions_app.llm.types import ModelError, Usage
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.roles import resolve_spec

logger = logging.getLogger(__name__)

FALLBACK_CHARS = 40
TITLE_MAX = 80
# What the titler sees: the opening user message (the start is what names a conversation).
TITLER_INPUT_CHARS = 4000
TITLER_PROMPT = (
    "Write a short title (at most 8 words) for a conversation that opens with the user's message below. "
    "Reply with the title only: no quotes, no trailing punctuation."
)
_SPACE = re.compile(r"\s+")
_QUOTES = "\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb"  # straight, curly and angle quotes


def clean(text: str | None, limit: int = TITLE_MAX) -> str:
    """One line, whitespace collapsed, wrapping quotes dropped, at most `limit` characters."""
    line = next((ln for ln in (text or "").splitlines() if ln.strip()), "")
    line = _SPACE.sub(" ", line).strip().strip(_QUOTES).strip()
    if line.lower().startswith("title:"):
        line = line[6:].strip().strip(_QUOTES).strip()
    return line[:limit].rstrip()


def fallback_title(first_user_text: str) -> str:
    """The first user message truncated to 40 characters."""
    return _SPACE.sub(" ", first_user_text).strip()[:FALLBACK_CHARS].rstrip()


def first_user_text(session_id: uuid.UUID | str) -> str | None:
    """The first user text of the session (index walk: (session, kind, seq))."""
    row = (
        Event.objects.filter(session_id=session_id, kind__in=("user/message", "context/injected"))
        .exclude(data__text="")
        .order_by("seq")
        .values_list("data", flat=True)
        .first()
    )
    if row is None or not str(row.get("text", "")).strip():
        return None
    return str(row["text"])


def _titler_title(spec: str, user_text: str) -> tuple[str, Usage | None]:
    messages = [
        {"role": "system", "content": TITLER_PROMPT},
        {"role": "user", "content": user_text[:TITLER_INPUT_CHARS]},
    ]
    if not connection.in_atomic_block:
        connection.close()  # no pooled connection is held across the model call
    reply = complete_utility(spec, messages)
    return clean(reply.content), reply.usage


def ensure_title(
    session_id: uuid.UUID | str,
    *,
    profile: AgentProfile | None = None,
    user_text: str | None = None,
    overrides: dict[str, str] | None = None,
) -> str | None:
    """Title the session if it has no title yet. Returns the title appended by
    this call, or None (already titled, or no user text yet). A turn runner
    passes what it already read (the profile, the first user text, the
    session's model overrides); anything missing is read from the log."""
    sid = uuid.UUID(str(session_id))
    if profile is None:
        row = Session.objects.filter(id=sid).values("title", "profile_id").first()
        if row is None or row["title"]:
            return None
        profile = AgentProfile.objects.filter(id=row["profile_id"]).first() if row["profile_id"] else None
    if user_text is None:
        user_text = first_user_text(sid)
        if user_text is None:
            return None
    spec = resolve_spec("titler", profile, sid, overrides=overrides)
    title, usage = "", None
    if spec:
        try:
            title, usage = _titler_title(spec, user_text)
        except ModelError as exc:
            logger.warning("titler %s failed for %s (%s); using the first message", spec, sid, exc)
    title = title or fallback_title(user_text)
    if not title:
        return None
    return _append_title(sid, title[:TITLE_MAX], spec, usage)


def _append_title(sid: uuid.UUID, title: str, spec: str | None, usage: Usage | None) -> str | None:
    if usage is None:
        # One guarded statement: it appends only while the session is untitled.
        written = log.append_many(sid, [("session/titled", {"title": title})], guard="untitled")
        return title if written else None
    with log.locked(sid) as tx:
        tx.append("usage/recorded", {"purpose": "title", "model": spec or "", "usage": usage.as_json()})
        if tx.row["title"]:
            return None  # another worker titled it while we asked the model
        tx.append("session/titled", {"title": title})
    return title
