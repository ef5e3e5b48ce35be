"""What the model is sent on a step: the request's messages, assembled in one
place for the runner (runner.py, every step) and for the context view
(web/context.py, "what the model sees next"), so the page shows exactly what
the next step sends: the profile's system prompt (or the default), then the
projection of the log after the latest compaction (log/projection.py)."""

from __future__ import annotations

import uuid
from typing import Any

from sessions_app.log.projection import derive_messages
from sessions_app.models import AgentProfile

DEFAULT_SYSTEM_PROMPT = "You are an agent running inside Terret. Use the tools you are given when they help."


def system_message(profile: AgentProfile | None) -> dict[str, Any]:
    return {"role": "system", "content": (profile.system_prompt if profile else "") or DEFAULT_SYSTEM_PROMPT}


def messages(profile: AgentProfile | None, projection: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages, given the model's view of the log (the runner
    has it from its turn view already)."""
    return [system_message(profile), *projection]


def build(session_id: uuid.UUID, profile: AgentProfile | None) -> list[dict[str, Any]]:
    """The next step's request messages, read from the log now."""
    return messages(profile, derive_messages(session_id))
