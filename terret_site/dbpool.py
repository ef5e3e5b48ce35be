"""The database pool's reconnect pace after an outage.

psycopg_pool retries a lost server with a backoff that doubles without a
cap (1, 2, 4, 8, 16 s ...: `AttemptWithBackoff`), so after a 20 s PostgreSQL
outage its next attempt came 8-12 s after the server was back, and every
turn and request waited for it (tests/chaos: the "PostgreSQL down 20 s"
drill; `python -m tests.chaos.repro_pool_backoff`). A connection attempt to
a server that is down is refused at once and costs next to nothing, so the
pool here tries about once a second for as long as the outage lasts
(`reconnect_timeout` still bounds it). psycopg_pool has no setting for this;
its backoff is a class attribute, set here once, when the settings load.
"""

from __future__ import annotations

RECONNECT_EVERY_SECONDS = 1.0


def cap_reconnect_backoff() -> None:
    # imported here: psycopg_pool is needed only when the settings configure a pool
    from psycopg_pool.base import AttemptWithBackoff

    AttemptWithBackoff.INITIAL_DELAY = RECONNECT_EVERY_SECONDS
    AttemptWithBackoff.DELAY_BACKOFF = 1.0
