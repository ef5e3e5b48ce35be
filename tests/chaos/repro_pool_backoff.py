"""Reproducer for the chaos pass's finding (docs/chaos.md, Findings): after
PostgreSQL has been down for 20 s, a psycopg_pool ConnectionPool (the one
Django opens in every worker, `OPTIONS["pool"]`) hands out a connection only
seconds after the server is back, because its reconnect attempts back off
1, 2, 4, 8, 16 s with no cap. A drive waiting in `getconn` waits that long.

    python -m tests.chaos.repro_pool_backoff            # the pool as configured: several seconds
    python -m tests.chaos.repro_pool_backoff --capped   # backoff held at 1 s: under a second

Runs its own throwaway cluster (tests/stack.py), never the machine's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "terret_site.settings")
os.environ.setdefault("TERRET_TESTING", "1")


def main(capped: bool, outage: float = 20.0) -> float:
    import django

    django.setup()
    import psycopg_pool.base
    from psycopg_pool import ConnectionPool

    from tests.stack import PrivatePostgres

    if capped:
        psycopg_pool.base.AttemptWithBackoff.DELAY_BACKOFF = 1.0
    root = Path(tempfile.mkdtemp(prefix="terret-pool-repro-"))
    os.chmod(root, 0o755)
    pg = PrivatePostgres(root)
    pg.start()
    # The settings' pool: min 4, max 20, 30 s to wait for a connection.
    pool = ConnectionPool(pg.url("postgres"), min_size=4, max_size=20, timeout=30, open=True)
    try:
        pool.wait()
        pg.stop()
        try:  # a drive's query meets the dead connection, as in the drill
            with pool.connection() as conn:
                conn.execute("SELECT 1")
        except Exception:
            pass
        pool.check()  # what sessions_app.runtime.failures.drop_dead_connections does
        time.sleep(outage)
        pg.start()
        up = time.monotonic()
        with pool.connection(timeout=60) as conn:
            conn.execute("SELECT 1")
        return time.monotonic() - up
    finally:
        pool.close()
        pg.close()


if __name__ == "__main__":
    waited = main(capped="--capped" in sys.argv)
    print(f"PostgreSQL down 20 s: the pool's first connection {waited:.1f}s after it accepted connections again")
