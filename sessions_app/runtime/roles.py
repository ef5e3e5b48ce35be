"""Resolving a model role to a spec for one session."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from django.conf import settings

from sessions_app.llm.types import DEMO_SPEC
from sessions_app.log.reads import model_overrides
from sessions_app.models import AgentProfile

DEFAULT_MAIN_WITH_KEY = "openai/gpt-4o-mini"


def resolve_spec(
    role: str,
    profile: AgentProfile | None,
    session_id: uuid.UUID | str | None = None,
    *,
    overrides: Mapping[str, str] | None = None,
) -> str | None:
    """Session override (model/updated) > profile role > TERRET_MODEL_<ROLE>.
    With nothing configured, main falls back to the offline demo model when
    no API key is set; titler and compactor stay unconfigured (None). A caller
    that already read the session's overrides passes them instead of the id."""
    if overrides is None and session_id is not None:
        overrides = model_overrides(session_id)
    spec = (overrides or {}).get(role)
    if spec:
        return spec
    if profile is not None:
        spec = (profile.roles or {}).get(role)
        if spec:
            return str(spec)
    env = {
        "main": settings.TERRET_MODEL_MAIN,
        "titler": settings.TERRET_MODEL_TITLER,
        "compactor": settings.TERRET_MODEL_COMPACTOR,
    }.get(role)
    if env:
        return env
    if role == "main":
        return DEFAULT_MAIN_WITH_KEY if settings.TERRET_LLM_API_KEY else DEMO_SPEC
    return None
