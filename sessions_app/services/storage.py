"""Storage tiering on behalf of people (runtime/storage.py does the moving):
a staff member's move of a session, and a door's touch of a cold one."""

from __future__ import annotations

import uuid
from typing import Any

from sessions_app.models import Session
from sessions_app.runtime import storage


def set_tier(session_id: uuid.UUID | str, tier: Any, *, by: str) -> str:
    return storage.set_tier(session_id, tier, by=by)


def ensure_hot(session_id: uuid.UUID | str) -> bool:
    return storage.ensure_hot(session_id)


def storage_of(session: Session) -> dict[str, Any]:
    return storage.storage_of(session)
