"""Counters of what worker processes do that no event records (sweep
rounds, takeovers, queue wait), kept in the database so every process on
every host adds to one figure (RuntimeCounter; /metrics reads it).

A process adds to its own tally in memory and the sweeper flushes it, one
atomic upsert per counter, every sweep round: counting costs the hot path
no statement. A process killed before its flush loses at most one round's
counts.
"""

from __future__ import annotations

import threading
from collections import Counter

from django.db import connection

from sessions_app.models import RuntimeCounter

_TABLE = RuntimeCounter._meta.db_table
_UPSERT = (
    f"INSERT INTO {_TABLE} (name, value) VALUES (%s, %s) "
    f"ON CONFLICT (name) DO UPDATE SET value = {_TABLE}.value + excluded.value"
)
_pending: Counter[str] = Counter()
_lock = threading.Lock()


def add(name: str, n: int = 1) -> None:
    with _lock:
        _pending[name] += n


def flush() -> None:
    with _lock:
        items = [(name, n) for name, n in _pending.items() if n]
        _pending.clear()
    if not items:
        return
    try:
        with connection.cursor() as cursor:
            for name, n in items:
                cursor.execute(_UPSERT, [name, n])
    except Exception:
        with _lock:  # keep them for the next round
            for name, n in items:
                _pending[name] += n
        raise


def forget() -> None:
    """Drop this process's unflushed counts (tests: a count one test left
    unflushed, its database gone, must not land in the next test's)."""
    with _lock:
        _pending.clear()
