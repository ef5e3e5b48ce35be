"""What the model sees: a projection of the log into OpenAI chat messages.

Only the latest session/compacted applies. Everything at or before its
upto_seq is replaced by its summary, so reads start at that compaction (found
through the (session, kind, seq) index) and never scan the whole log.
"""

from __future__ import annotations

import uuid
from typing import Any

from sessions_app.log.catalogue import MODEL_VISIBLE
from sessions_app.log.upcasters import lift
from sessions_app.models import Event

SUMMARY_PREFIX = "Summary of the conversation so far:\n"


def latest_compaction(session_id: uuid.UUID | str, until_seq: int | None = None) -> tuple[int, dict[str, Any]] | None:
    qs = Event.objects.filter(session_id=session_id, kind="session/compacted")
    if until_seq is not None:
        # "As of until_seq": a compaction appended later does not apply yet.
        qs = qs.filter(seq__lte=until_seq)
    row = qs.order_by("-seq").values_list("seq", "data", "version").first()
    return (row[0], lift("session/compacted", row[2], row[1])) if row else None


def render(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """One model-visible event as one OpenAI chat message."""
    if kind in ("user/message", "context/injected"):
        return {"role": "user", "content": data["text"]}
    if kind == "assistant/message":
        msg: dict[str, Any] = {"role": "assistant", "content": data.get("content")}
        calls = data.get("tool_calls") or []
        if calls:
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls
            ]
        return msg
    if kind == "tool/result":
        msg = {"role": "tool", "tool_call_id": data["call_id"], "content": data["content"]}
        if data.get("attachments"):  # a tool's images: llm.types.for_model decides what the model gets
            msg["attachments"] = data["attachments"]
        return msg
    if kind == "session/compacted":
        return {"role": "user", "content": SUMMARY_PREFIX + data["summary"]}
    raise ValueError(f"{kind} is not model-visible")


def derive_messages(session_id: uuid.UUID | str, *, until_seq: int | None = None) -> list[dict[str, Any]]:
    """The model's view of the session; with until_seq, as of that seq."""
    compaction = latest_compaction(session_id, until_seq)
    messages: list[dict[str, Any]] = []
    after = 0
    if compaction is not None:
        seq, data = compaction
        messages.append(render("session/compacted", data))
        after = seq
    rows = (
        Event.objects.filter(session_id=session_id, seq__gt=after, kind__in=MODEL_VISIBLE)
        .exclude(kind="session/compacted")
        .order_by("seq")
        .values_list("kind", "data", "version")
    )
    if until_seq is not None:
        rows = rows.filter(seq__lte=until_seq)
    messages.extend(render(kind, lift(kind, version, data)) for kind, data, version in rows)
    return messages
