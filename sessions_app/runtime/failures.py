"""What a failure inside a turn means: the one place that decides.

Transient: the same work may succeed later (a provider outage or throttle
after the adapter's own retries, a torn stream, a deadline). Permanent:
it will fail again however often it is tried (a provider's 4xx, an unknown
model, a broken profile, a payload the log refuses, a bug). A fresh turn
fails on either; only a turn re-entered after a crash retries a transient
failure, with backoff and a bounded number of attempts (runner.py), and is
then blocked. Database errors are not decided here: a drive retries those
itself (drive.py), because the turn is not what failed.

A blocked turn says why in a code (turn/blocked's `code`), for an operator:
RETRIES_EXHAUSTED; CONTEXT_OVERFLOW: a request the provider refused as
too long that compaction could not bring under the window; or
DEFINITION_MISSING: something the turn needs (a tool it called, an MCP
server, a summarizer, a model role) that the running code or the turn's
definition no longer provides (definitions.py), named in turn/blocked's
`what`. None fails the turn: new input, a Retry (after a bigger window, a
shorter system prompt, another model, the definition restored) or an
Abandon moves it on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError, connection

from sessions_app.llm.types import ModelError

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 600

# turn/blocked's codes.
RETRIES_EXHAUSTED = "retries_exhausted"
CONTEXT_OVERFLOW = "context_overflow"
DEFINITION_MISSING = "definition_missing"
# The log holds an event version no live worker reads (runtime/codever.py).
UNSUPPORTED_VERSION = "unsupported_version"


@dataclass(frozen=True)
class Failure:
    transient: bool
    message: str


def is_database_outage(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError | InterfaceError)


def drop_dead_connections() -> None:
    """After a database outage: close this thread's connection and, with a
    pool, have it check the idle ones. After a restart every pooled
    connection is dead, and without the check each retry (or request) would
    draw the next dead one. Only paid on an outage."""
    pool = getattr(connection, "pool", None)
    connection.close()
    if pool is not None:
        try:
            pool.check()
        except Exception:
            logger.warning("checking the connection pool failed", exc_info=True)


def classify(exc: BaseException) -> Failure:
    if isinstance(exc, ModelError):
        return Failure(exc.transient, clean(f"model call failed: {exc}"))
    return Failure(False, clean(f"{type(exc).__name__}: {exc}"))


def clean(text: str) -> str:
    """An error's text as a turn/end or turn/blocked carries it: no NUL, at most MAX_ERROR_CHARS."""
    text = text.replace("\x00", "\\u0000")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
