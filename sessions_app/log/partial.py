"""The open step's streamed text so far, for a socket that connects mid-stream.

Token deltas are live only (hints.publish_delta): a page reloaded in the
middle of a long reply would otherwise show it from where it reconnected,
mid-sentence. So the worker streaming a step also keeps that step's text
here, and a socket that has caught up sends it once (docs/protocol.md,
`partial`). Never durable and never the log: the step's assistant/message
supersedes it, and it is dropped when the model call ends.

Where it is kept: in Redis when REDIS_URL is set (the worker and the web
process are different processes), else in this process's memory (the
embedded in-process worker shares the web process). Bounded: at most
MAX_CHARS of text per session (the start of the reply is what a reload
needs), and a key expires after TTL_SECONDS so a crashed worker's text does
not linger. A Redis failure costs only this convenience: it is logged once,
Redis is left alone for BACKOFF_SECONDS (no timeout per token), and the
stream goes on.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings

from sessions_app.log import hints

logger = logging.getLogger(__name__)

MAX_CHARS = 200_000
TTL_SECONDS = 900
_TOUCH_EVERY = 200  # appends between TTL refreshes
# After a Redis failure, leave it alone this long: a stream must not wait on
# a timeout per token while Redis is down.
BACKOFF_SECONDS = 30.0


@dataclass
class _Entry:
    step: int
    parts: list[str] = field(default_factory=list)


class MemoryStore:
    """This process's open steps (embedded mode)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[uuid.UUID, _Entry] = {}

    def start(self, sid: uuid.UUID, step: int, text: str = "") -> None:
        with self._lock:
            self._entries[sid] = _Entry(step, [text] if text else [])

    def add(self, sid: uuid.UUID, step: int, text: str) -> None:
        with self._lock:
            entry = self._entries.get(sid)
            if entry is not None and entry.step == step:
                entry.parts.append(text)

    def clear(self, sid: uuid.UUID, step: int) -> None:
        with self._lock:
            entry = self._entries.get(sid)
            if entry is not None and entry.step == step:
                del self._entries[sid]

    def read(self, sid: uuid.UUID) -> tuple[int, str] | None:
        with self._lock:
            entry = self._entries.get(sid)
            return None if entry is None else (entry.step, "".join(entry.parts))


class RedisStore:
    """One key per session: "<step>\\n<text so far>", grown with APPEND.

    With `via_hints` (the store of this configuration: the same Redis as the
    hints), writes are not sent from the streaming thread: they ride the
    hints publisher's next pipelined flush, ahead of the deltas they hold
    (hints.publisher.write). A two-step turn then spends no round trip on
    this store; it is a convenience, and the thread that streams the model's
    reply was paying one round trip or more per step for it."""

    def __init__(self, url: str, prefix: str, *, via_hints: bool = False) -> None:
        self._client: Any = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self._prefix = prefix
        self._warned = False
        self._skip_until = 0.0
        self._via_hints = via_hints

    def _key(self, sid: uuid.UUID) -> str:
        return f"{self._prefix}:partial:{sid.hex}"

    def _safely(self, what: str, fn: Any, *args: Any) -> Any:
        if time.monotonic() < self._skip_until:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # redis.RedisError, OSError: never the turn's problem
            self._skip_until = time.monotonic() + BACKOFF_SECONDS
            if not self._warned:
                self._warned = True
                logger.warning("partial reply store: %s failed (%s); reloads mid-stream start empty", what, exc)
            return None

    def _queued(self, sid: uuid.UUID, op: str, text: str = "", ttl: int = 0) -> bool:
        return self._via_hints and hints.publisher.write(self._key(sid), op, text, ttl)

    def start(self, sid: uuid.UUID, step: int, text: str = "") -> None:
        if not self._queued(sid, "set", f"{step}\n{text}", TTL_SECONDS):
            self._safely("start", self._client.set, self._key(sid), f"{step}\n{text}", TTL_SECONDS)

    def add(self, sid: uuid.UUID, step: int, text: str) -> None:
        if not self._queued(sid, "append", text):
            self._safely("append", self._client.append, self._key(sid), text)

    def touch(self, sid: uuid.UUID) -> None:
        if not self._queued(sid, "expire", ttl=TTL_SECONDS):
            self._safely("expire", self._client.expire, self._key(sid), TTL_SECONDS)

    def clear(self, sid: uuid.UUID, step: int) -> None:
        if not self._queued(sid, "delete"):
            self._safely("delete", self._client.delete, self._key(sid))

    def read(self, sid: uuid.UUID) -> tuple[int, str] | None:
        raw = self._safely("read", self._client.get, self._key(sid))
        if not raw:
            return None
        head, _, text = raw.decode("utf-8", errors="replace").partition("\n")
        try:
            return int(head), text
        except ValueError:
            return None


_lock = threading.Lock()
_stores: dict[str, MemoryStore | RedisStore] = {}


def store() -> MemoryStore | RedisStore:
    """The store for this configuration (one per REDIS_URL and prefix)."""
    url = getattr(settings, "REDIS_URL", None) or ""
    key = f"{url}|{settings.CHANNEL_PREFIX}"
    with _lock:
        found = _stores.get(key)
        if found is None:
            found = RedisStore(url, settings.CHANNEL_PREFIX, via_hints=True) if url else MemoryStore()
            _stores[key] = found
        return found


class Recorder:
    """Keeps one model call's streamed text (the runner makes one per call)."""

    def __init__(self, session_id: uuid.UUID, step: int) -> None:
        self.sid = session_id
        self.step = step
        self.kept = 0
        self.appends = 0
        self.store = store()
        # The step's entry is written with its first text, not here: a reply
        # of tool calls alone then costs no write (an entry without text reads
        # as none, so_far), and the first text is one write, not two.

    def add(self, text: str) -> None:
        room = MAX_CHARS - self.kept
        if room <= 0 or not text:
            return  # bounded: the start of the reply is kept, the rest streams live
        piece = text[:room]
        if self.kept == 0:
            self.store.start(self.sid, self.step, piece)
        else:
            self.store.add(self.sid, self.step, piece)
        self.kept += len(piece)
        self.appends += 1
        if isinstance(self.store, RedisStore) and self.appends % _TOUCH_EVERY == 0:
            self.store.touch(self.sid)

    def close(self) -> None:
        # A call that kept no text wrote no entry, so it has none to drop: a
        # reply of tool calls alone costs no Redis command at all. (An entry a
        # crashed worker left for this session is overwritten by the next
        # text and expires after TTL_SECONDS; a reader shows it only for its
        # own step, which the log supersedes.)
        if self.kept:
            self.store.clear(self.sid, self.step)


def so_far(session_id: uuid.UUID) -> tuple[int, str] | None:
    """(step, text) of the session's step being streamed now, or None."""
    found = store().read(session_id)
    if found is None or not found[1]:
        return None
    return found
