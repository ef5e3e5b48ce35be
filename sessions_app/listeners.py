"""Session-event listeners registered at startup (see SessionsAppConfig.ready)."""

from __future__ import annotations
