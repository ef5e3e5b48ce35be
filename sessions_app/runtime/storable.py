"""Making model output and tool results storable as they are.

The log refuses NUL (PostgreSQL text cannot hold one) and every event must
fit a socket frame, but a model or a tool may produce either. Neither is a
reason to fail a turn: NUL is escaped (as the six characters `\\u0000`) and
text over its limit is cut, with a marker saying how much was cut. The
limits are settings: TERRET_MAX_MODEL_TEXT_CHARS (a reply's text),
TERRET_MAX_TOOL_ARGS_CHARS (one call's arguments), TERRET_MAX_TOOL_RESULT_CHARS
(one result), and TERRET_MAX_EVENT_BYTES for the whole event.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

CUT_MARK = "\n[… cut by Terret: {n} more characters]"


def escape_nul(text: str) -> str:
    return text.replace("\x00", "\\u0000") if "\x00" in text else text


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
