"""The session socket: /ws/sessions/{id}/?after=N. Protocol: docs/protocol.md.

The follower's two tasks (live/follow.py: the pump and the writer) and one
of its own, so nothing one of them waits on holds up the others:

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
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from sessions_app import actions
from sessions_app.actions.shapes import FRAMES, ClientFrame
from sessions_app.errors import (
    BadFrame,
    Busy,
    FrameTooLarge,
    InvalidInput,
    InvalidJson,
    TerretError,
    UnknownType,
    as_error,
    error_body,
)
from sessions_app.live.follow import AccessLost, Close, Follower, in_thread
from sessions_app.services import forks, schedules

logger = logging.getLogger(__name__)

MAX_FRAME_BYTES = 512 * 1024
PENDING_MAX = 32

ACTION_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="terret-ws-act")


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


class SessionConsumer(Follower):
    """The session protocol: JSON frames both ways (docs/protocol.md)."""

    async def connect(self) -> None:
        self.pending: asyncio.Queue[ClientFrame | TerretError] = asyncio.Queue(PENDING_MAX)
        await super().connect()

    def jobs(self) -> list[Coroutine[Any, Any, None]]:
        return [*super().jobs(), self._actor()]

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
            "stalled_since": state["stalled_since"],
            "budget": state.get("budget"),
            "version": state.get("version"),
            "can_drive": access["can_drive"],
            "can_approve": access["can_approve"],
            "max_frame_bytes": MAX_FRAME_BYTES,
        }
        return json.dumps(hello)

    def synced_frame(self) -> str:
        return json.dumps({"type": "synced", "seq": self.last_sent})

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
                result = await in_thread(self._perform, ACTION_POOL)(frame)
            except Exception as exc:
                error = as_error(exc)
                if error.status >= 500:
                    logger.exception("socket frame %s on session %s failed", frame.type, self.sid)  # type: ignore[attr-defined]
                await self._reply_error(frame.id, error)
                if isinstance(exc, AccessLost):
                    await self.outbox.put(Close(4403))
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
                    ).as_json()
                }
            case "withdraw":
                return {"receipt": actions.withdraw(user, sid, frame.seq).as_json()}
            case "schedule":
                made, _ = actions.create_schedule(user, sid, frame.schedule.model_dump(exclude_none=True))
                return {"schedule": schedules.as_json(made)}
            case "cancel_schedule":
                return {"schedule": schedules.as_json(actions.cancel_schedule(user, sid, frame.schedule_id))}
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
                ).as_json()
            case "cancel":
                return actions.cancel(user, sid).as_json()
            case "retry":
                return actions.retry(user, sid).as_json()
            case "compact":
                return actions.compact(user, sid).as_json()
            case "set_policy":
                return actions.set_policy(user, sid, frame.patterns).as_json()
            case "set_model":
                return actions.set_model(user, sid, frame.role, frame.spec).as_json()
            case "budget":
                return {"budget": actions.set_budget(user, sid, frame.limit.model_dump()).as_json()}
            case "fork":
                return {"session": forks.as_json(actions.fork(user, sid, frame.at_seq, frame.policy))}
            case "ping":
                actions.session_for(user, sid, "view")
                return {}
        raise InvalidInput(f"unhandled frame type {frame.type!r}")  # FRAMES and this match are out of step
