"""Writes on behalf of people, and the work that follows a turn.

The functions most callers need are re-exported here (`services.inject`);
the modules are sessions (sessions and agents, model roles), inputs
(admission and cancel), compaction with its summarizers, titling, usage,
and post_turn (the after-turn hook). Modules of this package import each
other by module, never through this file.
"""

from __future__ import annotations

from sessions_app.services.inputs import MAX_INPUT_CHARS, Receipt, cancel, inject, resumable, retry, run_turn
from sessions_app.services.sessions import create_session, dispose_agent, set_model, spawn_agent

__all__ = [
    "MAX_INPUT_CHARS",
    "Receipt",
    "cancel",
    "create_session",
    "dispose_agent",
    "inject",
    "resumable",
    "retry",
    "run_turn",
    "set_model",
    "spawn_agent",
]
