"""The session socket: /ws/sessions/{id}/?after=N. Protocol: docs/protocol.md.

Three tasks per socket, so nothing one of them waits on holds up the others:

- the pump sends committed events in seq order: first the replay from
  `after` (pages of 1000 from the database), then whatever each commit hint
  announces (read from the database or the per-process frame cache, never
  from the hint itself). It re-reads every POLL_SECONDS too, so a lost hint
  only delays an event, and checks then that the user may still read the
  session.
- the actor handles client frames one at a time, in order, each through
  sessions_app/actions/ in a worker thread (a compaction's model call must not stop
  events from flowing).
- the writer drains a bounded outbox to the client. When a slow client lets
  it fill, the pump just waits (it resumes from its last seq, the database
  is its queue) and deltas are dropped; other sockets are unaffected. Every
  frame goes out through `send_frame`: one larger than a socket may carry
  (an event over TERRET_SOCKET_MAX_FRAME_BYTES) is replaced by its stand-in
  (sockets/frames.py), so the stream goes on past it.

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
from pydantic import ValidationError

from sessions_app import actions
from sessions_app.api.schemas import FRAMES, ClientFrame
from sessions_app.errors import (
    BadFrame,
    Busy,
    FrameTooLarge,
    InvalidInput,
    InvalidJson,
    NotAllowed,
    TerretError,
    Unauthenticated,
    UnknownType,
    as_error,
    error_body,
)
from sessions_app.log import hints, partial, reads
from sessions_app.sockets import frames, hub
from sessions_app.sockets.auth import live_user

logger = logging.getLogger(__name__)

MAX_FRAME_BYTES = 512 * 1024
OUTBOX_MAX = 256
PENDING_MAX = 32
POLL_SECONDS = 5.0

ACTION_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="terret-ws-act")
# Polls and access checks run apart from the reads that carry live events, so
# a burst of them never delays a hint's read.
CHECK_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="terret-ws-check")


def _in_thread(fn: Callable[..., Any], pool: ThreadPoolExecutor) -> Callable[..., Coroutine[Any, Any, Any]]:
    return database_sync_to_async(fn, thread_sensitive=False, executor=pool)  # type: ignore[no-any-return]


class AccessLost(NotAllowed):
    """The user may no longer use this socket (token revoked, user
    deactivated or signed out, permission removed)."""


class _Close:
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


def parse_frame(text: str | None, data: bytes | None) -> ClientFrame:
    """A validated client frame, or a TerretError with `.frame_id` set to the
    frame's id when it had a usable one."""
    if text is None:
        raise BadFrame("binary frames are not supported; send JSON text frames")
    if len(text) > MAX_FRAME_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frames are limited to {MAX_FRAME_BYTES} bytes")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidJson(f"frame is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise BadFrame("a frame must be a JSON object with a 'type'")
    frame_id = obj.get("id")
    valid_id = (isinstance(frame_id, str) and len(frame_id) <= 64) or (
        isinstance(frame_id, int) and not isinstance(frame_id, bool)
    )
    try:
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise InvalidInput("a frame needs a string 'type'")
        model = FRAMES.get(kind)
        if model is None:
            raise UnknownType(f"unknown frame type {kind[:40]!r}; see docs/protocol.md")
        try:
            return model.model_validate(obj)
        except ValidationError as exc:
            raise InvalidInput(_describe(exc)) from None
    except TerretError as exc:
        exc.frame_id = frame_id if valid_id else None  # type: ignore[attr-defined]
        raise


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = ".".join(str(p) for p in error["loc"]) or "frame"
        parts.append(f"{loc}: {error['msg']}")
    return "; ".join(parts)


class SessionConsumer(AsyncWebsocketConsumer):
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
        self.outbox: asyncio.Queue[str | _Close] = asyncio.Queue(OUTBOX_MAX)
        self.pending: asyncio.Queue[ClientFrame | TerretError] = asyncio.Queue(PENDING_MAX)
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
            access = await _in_thread(actions.socket_access, hub.READ_POOL)(
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
            state = await _in_thread(actions.live_state, hub.READ_POOL)(self.sid)
            state["budget"] = await _in_thread(actions.budget_state, hub.READ_POOL)(self.sid)
        except Exception:
            logger.exception("session socket for %s could not start", self.sid)
            await self.disconnect(1011)
            await self.close(code=1011)  # the client reconnects with ?after=
            return
        await self.outbox.put(self.hello_frame(access, state))
        for job in (self._writer(), self._pump(), self._actor()):
            self.tasks.append(asyncio.create_task(self._guard(job)))

    def hello_frame(self, access: dict[str, Any], state: dict[str, Any]) -> str:
        """`state`: actions.live_state, read after subscribing (the head and the
        status of one read of the session row)."""
        hello = {
            "type": "hello",
            "session": str(self.sid),
            "after": self.last_sent,
            "last_seq": state["last_seq"],
            "status": state["status"],
            "blocked": state["blocked"],
            "waiting": state["waiting"],
            "unknown_effects": state["unknown_effects"],
            "budget": state.get("budget"),
            "can_drive": access["can_drive"],
            "can_approve": access["can_approve"],
            "max_frame_bytes": MAX_FRAME_BYTES,
        }
        return json.dumps(hello)

    def synced_frame(self) -> str:
        return json.dumps({"type": "synced", "seq": self.last_sent})

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
            if isinstance(item, _Close):
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
            if len(rows) < reads.PAGE:
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
                    rows = await _in_thread(self._poll, CHECK_POOL)(self.last_sent)
                except AccessLost as exc:
                    await self.outbox.put(json.dumps({"type": "error", **error_body(exc)}))
                    await self.outbox.put(_Close(4403))
                    return
                await self._send_events(rows)

    async def _send_partial(self) -> None:
        """Once caught up: the open step's text streamed so far (log/partial.py),
        so a client that connects mid-reply shows its start. Deltas that arrive
        while it is read are held, and those the text already holds dropped."""
        assert self.sid is not None
        found: tuple[int, str] | None = None
        try:
            found = await _in_thread(partial.so_far, hub.READ_POOL)(self.sid)
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
            await self.outbox.put(text)  # waits while a slow client's outbox is full
            self.last_sent = seq

    def _poll(self, after: int) -> list[reads.EventFrame]:
        assert self.sid is not None
        try:
            actions.session_for(self._current_user(), self.sid, "view")
        except TerretError as exc:
            raise AccessLost(f"you may no longer read this session: {exc}") from None
        return reads.event_frames(self.sid, after)

    # ------------------------------------------------------------ client frames

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        item: ClientFrame | TerretError
        try:
            item = parse_frame(text_data, bytes_data)
        except TerretError as exc:
            item = exc  # replied to by the actor, so replies keep the frames' order
        try:
            self.pending.put_nowait(item)
        except asyncio.QueueFull:
            # Overload: this one reply may overtake earlier ones.
            frame_id = item.id if isinstance(item, ClientFrame) else getattr(item, "frame_id", None)
            await self._reply_error(frame_id, Busy(f"more than {PENDING_MAX} frames are waiting; slow down"))

    async def _reply_error(self, frame_id: Any, exc: TerretError) -> None:
        reply: dict[str, Any] = {"type": "error"}
        if frame_id is not None:
            reply["id"] = frame_id
        await self.outbox.put(json.dumps({**reply, **error_body(exc)}))

    async def _actor(self) -> None:
        while True:
            frame = await self.pending.get()
            if isinstance(frame, TerretError):
                await self._reply_error(getattr(frame, "frame_id", None), frame)
                continue
            try:
                result = await _in_thread(self._perform, ACTION_POOL)(frame)
            except Exception as exc:
                error = as_error(exc)
                if error.status >= 500:
                    logger.exception("socket frame %s on session %s failed", frame.type, self.sid)  # type: ignore[attr-defined]
                await self._reply_error(frame.id, error)
                if isinstance(exc, AccessLost):
                    await self.outbox.put(_Close(4403))
                    return
                continue
            reply: dict[str, Any] = {"type": "ack"}
            if frame.id is not None:
                reply["id"] = frame.id
            await self.outbox.put(json.dumps({**reply, "op": frame.type, **result}))  # type: ignore[attr-defined]

    def _perform(self, frame: Any) -> dict[str, Any]:
        """Runs in a worker thread: who is acting now, then one operation."""
        user = self._current_user()
        sid = self.sid
        match frame.type:
            case "inject":
                return {
                    "receipt": actions.inject(
                        user,
                        sid,
                        frame.text,
                        frame.wake,
                        frame.idempotency_key,
                        lane=frame.lane,
                        multitask_strategy=frame.multitask_strategy,
                    )
                }
            case "withdraw":
                return {"receipt": actions.withdraw(user, sid, frame.seq)}
            case "schedule":
                made, _ = actions.create_schedule(user, sid, frame.schedule.model_dump(exclude_none=True))
                return {"schedule": made}
            case "cancel_schedule":
                return {"schedule": actions.cancel_schedule(user, sid, frame.schedule_id)}
            case "approve" | "deny":
                return actions.decide(
                    user,
                    sid,
                    frame.call_id,
                    frame.type,
                    frame.reason,
                    frame.request_seq,
                    edited_args=frame.edited_args,
                    allow_for_session=frame.allow_for_session,
                )
            case "cancel":
                return actions.cancel(user, sid)
            case "retry":
                return actions.retry(user, sid)
            case "compact":
                return actions.compact(user, sid)
            case "set_policy":
                return actions.set_policy(user, sid, frame.patterns)
            case "set_model":
                return actions.set_model(user, sid, frame.role, frame.spec)
            case "budget":
                return {"budget": actions.set_budget(user, sid, frame.limit.model_dump())}
            case "fork":
                return {"session": actions.fork(user, sid, frame.at_seq, frame.policy)}
            case "ping":
                actions.session_for(user, sid, "view")
                return {}
        raise InvalidInput(f"unhandled frame type {frame.type!r}")  # FRAMES and this match are out of step

    def _current_user(self) -> Any:
        """The user, re-read for every frame: a token revoked or a user
        deactivated since the socket opened stops working at once."""
        user = live_user(self.user_id, self.token_id, self.session_key)
        if user is None:
            raise AccessLost("this account is inactive, its token was revoked, or it signed out")
        return user
