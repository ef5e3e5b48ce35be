"""Making model output and tool results storable as they are.

The log refuses NUL (PostgreSQL text cannot hold one) and lone surrogates
(UTF-8 cannot encode one), and every event must fit a socket frame, but a
model or a tool may produce any of these. None is a reason to fail a turn:
NUL is escaped (as the six characters `\\u0000`), a lone surrogate becomes
U+FFFD, and text over its limit is cut, with a marker saying how much was cut. The
limits are settings: TERRET_MAX_MODEL_TEXT_CHARS (a reply's text),
TERRET_MAX_TOOL_ARGS_CHARS (one call's arguments), TERRET_MAX_TOOL_RESULT_CHARS
(one result), and TERRET_MAX_EVENT_BYTES for the whole event. A tool
result's images (attachments) are kept whole or not at all: at most
TERRET_MAX_TOOL_IMAGES of them, each at most TERRET_MAX_TOOL_IMAGE_CHARS of
base64, all of them together within half the event limit; one that does not
fit is left out and the result's text says so.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings

from sessions_app.validation import without_surrogates

CUT_MARK = "\n[… cut by Terret: {n} more characters]"
# Defaults of the image limits (settings of the same names override them).
MAX_TOOL_IMAGES = 4
MAX_TOOL_IMAGE_CHARS = 256 * 1024
# What providers take as image parts.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
IMAGE_LEFT_OUT = "\n[image {n} ({mime}, {chars} base64 characters) left out by Terret: {why}]"


def escape_nul(text: str) -> str:
    """`text` storable: NUL escaped, lone surrogates replaced."""
    return without_surrogates(text.replace("\x00", "\\u0000") if "\x00" in text else text)


def fit(text: str, limit: int) -> str:
    """`text` with NUL escaped, cut to at most `limit` characters (marker included)."""
    text = escape_nul(text)
    if len(text) <= limit:
        return text
    keep = max(limit - len(CUT_MARK.format(n=len(text))), 0)
    return text[:keep] + CUT_MARK.format(n=len(text) - keep)


def was_cut(text: str) -> bool:
    return "\n[… cut by Terret: " in text


def fit_result(content: str) -> str:
    return fit(content, settings.TERRET_MAX_TOOL_RESULT_CHARS)


def fit_assistant(data: dict[str, Any]) -> dict[str, Any]:
    """An assistant/message payload within every limit, the event's included."""
    if data.get("content") is not None:
        data["content"] = fit(data["content"], settings.TERRET_MAX_MODEL_TEXT_CHARS)
    for call in data.get("tool_calls") or []:
        call["arguments"] = fit(call["arguments"], settings.TERRET_MAX_TOOL_ARGS_CHARS)
        call["name"] = fit(call["name"], 200)
        call["id"] = fit(call["id"], 200)
    # Many calls can still add up: halve the longest text until the event fits.
    # (A char is at most 6 bytes in JSON: most replies skip the measuring.)
    rough = len(data.get("content") or "") + sum(len(c["arguments"]) + 64 for c in data.get("tool_calls") or [])
    if rough * 6 + 1024 < settings.TERRET_MAX_EVENT_BYTES:
        return data
    while _size(data) > settings.TERRET_MAX_EVENT_BYTES:
        fields = [("content", data)] if data.get("content") else []
        fields += [("arguments", c) for c in data.get("tool_calls") or []]
        key, holder = max(fields, key=lambda f: len(f[1][f[0]]))
        if len(holder[key]) < 200:
            break  # nothing long is left; the log's own check has the last word
        holder[key] = fit(holder[key], len(holder[key]) // 2)
    return data


def _size(data: dict[str, Any]) -> int:
    return len(json.dumps(data, ensure_ascii=False).encode())


def fit_attachments(content: str, attachments: Any) -> tuple[str, list[dict[str, Any]]]:
    """The images of a tool result that may be stored, and its text with a
    line for each one left out (too many, too large, or malformed). A cut
    image would be a broken one, so each is kept whole or dropped."""
    most = getattr(settings, "TERRET_MAX_TOOL_IMAGES", MAX_TOOL_IMAGES)
    each = getattr(settings, "TERRET_MAX_TOOL_IMAGE_CHARS", MAX_TOOL_IMAGE_CHARS)
    room = settings.TERRET_MAX_EVENT_BYTES // 2  # the other half is the text's and the event's own
    kept: list[dict[str, Any]] = []
    for n, item in enumerate(attachments or (), start=1):
        data, mime = item.get("data"), item.get("mime_type")
        why = ""
        if not isinstance(data, str) or not isinstance(mime, str):
            why, data, mime = "not an image Terret can pass on", data if isinstance(data, str) else "", str(mime)
        elif item.get("type") != "image" or mime not in IMAGE_TYPES or not _BASE64.fullmatch(data):
            why = f"not an image Terret can pass on (models take {', '.join(sorted(IMAGE_TYPES))} in base64)"
        elif len(kept) >= most:
            why = f"a result keeps at most {most} images"
        elif len(data) > each:
            why = f"larger than {each} base64 characters"
        elif len(data) > room:
            why = "the result's images would not fit one event"
        if why:
            content += IMAGE_LEFT_OUT.format(n=n, mime=escape_nul(mime)[:100], chars=len(data), why=why)
            continue
        room -= len(data)
        kept.append({"type": "image", "mime_type": escape_nul(mime)[:100], "data": escape_nul(data)})
    return content, kept
