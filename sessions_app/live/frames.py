"""How big a frame the sockets may send, and what goes out instead of one too big.

No frame a socket sends is ever larger than TERRET_SOCKET_MAX_FRAME_BYTES
(UTF-8 bytes, below the 1 MiB that daphne's peers accept). The log may hold
an event larger than that, so every consumer sends through `fit`: a frame
that fits goes out as it is; one that does not is replaced by the
consumer's explicit stand-in, never dropped and never left to stall the
socket (a peer that refuses a frame closes the connection, and a client
that reconnects from its last seq would meet the same frame again, forever).

- the session socket (JSON): `event_stand_in`, the event's seq, kind and
  time with `"oversize": true` and its size, no data; the client reads the
  event itself over HTTP (GET /api/sessions/{id}/events?after=seq-1&limit=1);
- the chat page (HTML): the event's row rendered with its text cut and a
  visible "shown in part" note (web/present.py), and a batch of rows split
  over as many frames as it takes (`pack`);
- the dashboard: a notice to reload.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)


def limit() -> int:
    return int(settings.TERRET_SOCKET_MAX_FRAME_BYTES)


def size(text: str) -> int:
    """The frame's size on the wire (its UTF-8 encoding)."""
    return len(text.encode("utf-8", "surrogatepass"))


def fits(text: str, max_bytes: int | None = None) -> bool:
    cap = limit() if max_bytes is None else max_bytes
    if len(text) * 4 <= cap:  # no character encodes to more than 4 bytes
        return True
    return len(text) <= cap and size(text) <= cap


def fit(
    text: str, stand_in: Callable[[str, int], str], max_bytes: int | None = None, *, last_resort: str | None = None
) -> str:
    """`text` if it fits in one frame, else `stand_in(text, its size)`; a
    stand-in that does not fit either becomes `last_resort` (by default an
    error frame naming the size)."""
    cap = limit() if max_bytes is None else max_bytes
    if fits(text, cap):
        return text
    nbytes = size(text)
    logger.warning("a %d-byte socket frame is over the %d-byte limit; sending its stand-in", nbytes, cap)
    replacement = stand_in(text, nbytes)
    if fits(replacement, cap):
        return replacement
    logger.error("the stand-in of a %d-byte socket frame does not fit either", nbytes)
    return too_large(nbytes) if last_resort is None else last_resort


def too_large(nbytes: int) -> str:
    return json.dumps(
        {"type": "error", "code": "frame_too_large", "message": f"a {nbytes}-byte frame was not sent", "bytes": nbytes}
    )


def event_stand_in(text: str, nbytes: int) -> str:
    """The session socket's stand-in: an event frame without its data, or,
    for any other frame (none is expected to be this large), the frame's
    type and id with `oversize`."""
    try:
        frame: Any = json.loads(text)
    except ValueError:
        return too_large(nbytes)
    if not isinstance(frame, dict):
        return too_large(nbytes)
    if frame.get("type") == "event":
        keep = {k: frame[k] for k in ("seq", "kind", "at") if k in frame}
        return json.dumps({"type": "event", **keep, "oversize": True, "bytes": nbytes})
    keep = {k: frame[k] for k in ("type", "id", "op") if k in frame and isinstance(frame[k], str | int)}
    return json.dumps({**keep, "oversize": True, "bytes": nbytes})


def pack(pieces: Iterable[str], max_bytes: int | None = None) -> list[str]:
    """Consecutive pieces joined into as few frames as fit, in order. Each
    piece must fit on its own (a caller fits it first)."""
    cap = limit() if max_bytes is None else max_bytes
    frames: list[str] = []
    current: list[str] = []
    used = 0
    for piece in pieces:
        if not piece:
            continue
        n = size(piece)
        if current and used + n > cap:
            frames.append("".join(current))
            current, used = [], 0
        current.append(piece)
        used += n
    if current:
        frames.append("".join(current))
    return frames
