"""A socket that follows one session's log: the floor of the session
socket (sockets/session.py) and the chat page's socket (web/page_socket.py).

Two tasks per socket, so nothing one of them waits on holds up the other (a
door adds its own, e.g. the session protocol's actor for client frames):

- the pump sends committed events in seq order: first the replay from
  `after`, in pages bounded in count and bytes (log.reads.event_frames),
  then whatever each commit hint announces (read from the database or the
  per-process frame cache, never from the hint itself). It re-reads every
  POLL_SECONDS too, so a lost hint only delays an event, and checks then
  that the user may still read the session (actions.session_for).
- the writer drains a bounded outbox to the client (live/outbox.py: at most
  OUTBOX_MAX frames and TERRET_SOCKET_OUTBOX_BYTES). When a slow client lets
  it fill, the pump just waits (it resumes from its last seq, the database
  is its queue) and deltas are dropped; other sockets are unaffected. Every
  frame goes out through `send_frame`: one larger than a socket may carry
  (an event over TERRET_SOCKET_MAX_FRAME_BYTES) is replaced by its stand-in
  (live/frames.py), so the stream goes on past it.

Hints and deltas arrive through hub.Hub (on_hint, on_delta), which only
note the news and return.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from sessions_app import actions
from sessions_app.errors import InvalidInput, NotAllowed, TerretError, Unauthenticated, error_body
from sessions_app.live import frames, hub
from sessions_app.live.auth import live_user
from sessions_app.live.outbox import Outbox, max_bytes
from sessions_app.log import hints, partial, reads

logger = logging.getLogger(__name__)

OUTBOX_MAX = 256
POLL_SECONDS = 5.0

# Polls and access checks run apart from the reads that carry live events, so
# a burst of them never delays a hint's read.
CHECK_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="terret-ws-check")


def in_thread(fn: Callable[..., Any], pool: ThreadPoolExecutor) -> Callable[..., Coroutine[Any, Any, Any]]:
    return database_sync_to_async(fn, thread_sensitive=False, executor=pool)  # type: ignore[no-any-return]


class AccessLost(NotAllowed):
    """The user may no longer use this socket (token revoked, user
    deactivated or signed out, permission removed)."""


class Close:
    def __init__(self, code: int) -> None:
        self.code = code


def not_yet_in(step: int, text: str, held: list[str]) -> list[str]:
    """The held frames minus the deltas of `step` that `text` (read from the
    store meanwhile) already ends with. The worker keeps a delta before it
    publishes it, so the deltas the text holds are a prefix of the held ones;
    at the seam a few characters may repeat or be missing until the step's
    message lands (deltas are best-effort, the message is exact)."""
    texts = []
    for frame in held:
        data = json.loads(frame)
        same = data.get("type") == "delta" and data.get("step") == step
        texts.append(str(data.get("text") or "") if same else None)
    covered = 0
    joined = ""
    for i, piece in enumerate(texts):
        if piece is None:
            continue
        joined += piece
        if text.endswith(joined):
            covered = i + 1
    return [frame for i, frame in enumerate(held) if i >= covered or texts[i] is None]


def parse_after(scope: dict[str, Any]) -> int:
    values = parse_qs(scope.get("query_string", b"").decode("latin1")).get("after")
    if not values:
        return 0
    raw = values[-1]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise InvalidInput("after must be an integer >= 0")
    return int(raw)


class Follower(AsyncWebsocketConsumer):
    # No channel of its own: hints reach sockets through hub.Hub, one
    # channel-layer subscription per session per process (an alias that names
    # no layer makes channels skip the per-socket channel and its receive).
    channel_layer_alias = "terret-sockets-listen-through-the-hub"
    sid: uuid.UUID | None = None

    # ------------------------------------------------------------ lifecycle

    async def connect(self) -> None:
        # The in-memory channel layer lives in this loop: hints from append
        # threads are scheduled onto it (embedded mode).
        hints.publisher.register_server_loop(asyncio.get_running_loop())
        self.tasks: list[asyncio.Task[None]] = []
        self.outbox: Outbox[str | Close] = Outbox(OUTBOX_MAX, max_bytes())
        self.wake = asyncio.Event()
        self.target = 0
        self.synced = False
        self.deltas_dropped = 0
        # While the open step's text so far is read (see _send_partial): the deltas that arrive meanwhile.
        self.held_deltas: list[str] | None = None
        await self.accept()

        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return await self._refuse(Unauthenticated("sign in, or connect with ?token="), 4401)
        self.user_id = user.pk
        self.token_id: int | None = self.scope.get("api_token_id")
        session = self.scope.get("session")
        self.session_key: str | None = getattr(session, "session_key", None) if self.token_id is None else None
        try:
            self.last_sent = parse_after(self.scope)
        except InvalidInput as exc:
            return await self._refuse(exc, 4400)
        try:
            access = await in_thread(actions.socket_access, hub.READ_POOL)(
                user, self.scope["url_route"]["kwargs"]["session_id"]
            )
        except TerretError as exc:
            return await self._refuse(exc, 4404 if exc.status == 404 else 4403)

        self.sid = access["session"]
        hub.frame_cache().watch(self.sid)
        try:
            # Subscribe before reading the head: every event committed after
            # this line gets a hint, and everything before it is in the first read.
            await hub.process_hub().subscribe(self.sid, self)
            state = await in_thread(actions.live_state, hub.READ_POOL)(self.sid)
            state["budget"] = (await in_thread(actions.budget_state, hub.READ_POOL)(self.sid)).as_json()
        except Exception:
            logger.exception("session socket for %s could not start", self.sid)
            await self.disconnect(1011)
            await self.close(code=1011)  # the client reconnects with ?after=
            return
        await self.outbox.put(self.hello_frame(access, state))
        for job in self.jobs():
            self.tasks.append(asyncio.create_task(self._guard(job)))

    def hello_frame(self, access: dict[str, Any], state: dict[str, Any]) -> str:
        """The first frame, once let in (`access`: actions.socket_access;
        `state`: actions.live_state, read after subscribing). "": none."""
        return ""

    def synced_frame(self) -> str:
        """The frame that says the replay is done. "": none."""
        return ""

    def jobs(self) -> list[Coroutine[Any, Any, None]]:
        """The socket's tasks: the writer and the pump (a door adds its own)."""
        return [self._writer(), self._pump()]

    async def disconnect(self, code: int) -> None:
        for task in getattr(self, "tasks", []):
            task.cancel()
        if self.sid is not None:
            hub.frame_cache().unwatch(self.sid)
            await hub.process_hub().unsubscribe(self.sid, self)
            self.sid = None

    async def _refuse(self, exc: TerretError, code: int) -> None:
        await self.send(text_data=json.dumps({"type": "error", **error_body(exc)}))
        await self.close(code=code)

    async def _guard(self, job: Coroutine[Any, Any, None]) -> None:
        try:
            await job
        except asyncio.CancelledError:
            raise
        except Exception:
            # A broken socket must not go silent: close it so the client
            # reconnects (with ?after=) and gets a fresh consumer.
            logger.exception("session socket %s failed", self.sid)
            await self.close(code=1011)

    # ------------------------------------------------------------ hub (hub.Subscriber)

    def on_hint(self, seq: int) -> None:
        self.target = max(self.target, seq)
        if seq > self.last_sent:
            # Even a repeated seq wakes the pump: a read may have come up
            # short while that seq was still committing.
            self.wake.set()

    def on_delta(self, frame: str) -> None:
        if not self.synced:
            return  # mid-replay the client is not looking at the live step yet
        if self.held_deltas is not None:
            self.held_deltas.append(frame)  # sent after the step's text so far (_send_partial)
            return
        try:
            self.outbox.put_nowait(frame)
        except asyncio.QueueFull:
            self.deltas_dropped += 1  # best-effort by design: assistant/message has the full text

    def on_live(self, frame: str) -> None:
        """A live hint (a tool call's progress): best-effort, like a delta."""
        self.on_delta(frame)

    # ------------------------------------------------------------ writer

    async def _writer(self) -> None:
        while True:
            item = await self.outbox.get()
            if isinstance(item, Close):
                await self.close(code=item.code)
                return
            if item:
                await self.send_frame(item)

    async def send_frame(self, text: str) -> None:
        """Every frame this socket sends: measured, and replaced by its
        stand-in when it is larger than a socket may carry."""
        await self.send(text_data=frames.fit(text, self.stand_in))

    def stand_in(self, text: str, nbytes: int) -> str:
        """What is sent instead of a frame over the limit: for an event, its
        seq, kind and time with "oversize": true and its size, no data."""
        return frames.event_stand_in(text, nbytes)

    # ------------------------------------------------------------ pump

    async def _pump(self) -> None:
        assert self.sid is not None
        cache = hub.frame_cache()
        while True:  # replay: straight from the database, page by page
            rows = await cache.read(self.sid, self.last_sent)
            await self._send_events(rows)
            if not reads.more_follow(rows, reads.PAGE):
                break
        self.held_deltas = []
        self.synced = True
        await self.outbox.put(self.synced_frame())
        await self._send_partial()
        while True:
            self.wake.clear()
            if self.target > self.last_sent:
                rows = await cache.live(self.sid, self.last_sent, self.target)
                await self._send_events(rows)
                if rows:
                    continue
            try:
                # Jittered, so the sockets of one process do not poll in step.
                await asyncio.wait_for(self.wake.wait(), POLL_SECONDS * random.uniform(0.8, 1.2))
            except TimeoutError:
                try:
                    rows = await in_thread(self._poll, CHECK_POOL)(self.last_sent)
                except AccessLost as exc:
                    await self.outbox.put(json.dumps({"type": "error", **error_body(exc)}))
                    await self.outbox.put(Close(4403))
                    return
                await self._send_events(rows)

    async def _send_partial(self) -> None:
        """Once caught up: the open step's text streamed so far (log/partial.py),
        so a client that connects mid-reply shows its start. Deltas that arrive
        while it is read are held, and those the text already holds dropped."""
        assert self.sid is not None
        found: tuple[int, str] | None = None
        try:
            found = await in_thread(partial.so_far, hub.READ_POOL)(self.sid)
        finally:
            held, self.held_deltas = self.held_deltas or [], None
        if found is not None:
            self.on_partial(*found)
            held = not_yet_in(found[0], found[1], held)
        for frame in held:
            self.on_delta(frame)

    def on_partial(self, step: int, text: str) -> None:
        """The `partial` frame: the step's whole text so far; it replaces any deltas of that step."""
        try:
            self.outbox.put_nowait(json.dumps({"type": "partial", "step": step, "text": text}))
        except asyncio.QueueFull:
            self.deltas_dropped += 1  # best-effort, as deltas are

    async def _send_events(self, rows: list[reads.EventFrame]) -> None:
        for seq, text in rows:
            if seq <= self.last_sent:
                continue
            # Fitted first, so the outbox's byte bound counts what is sent;
            # waits while a slow client's outbox is full (live/outbox.py).
            await self.outbox.put(frames.fit(text, self.stand_in))
            self.last_sent = seq

    def _poll(self, after: int) -> list[reads.EventFrame]:
        assert self.sid is not None
        try:
            actions.session_for(self._current_user(), self.sid, "view")
        except TerretError as exc:
            raise AccessLost(f"you may no longer read this session: {exc}") from None
        return reads.event_frames(self.sid, after)

    def _current_user(self) -> Any:
        """The user, re-read for every frame: a token revoked or a user
        deactivated since the socket opened stops working at once."""
        user = live_user(self.user_id, self.token_id, self.session_key)
        if user is None:
            raise AccessLost("this account is inactive, its token was revoked, or it signed out")
        return user
