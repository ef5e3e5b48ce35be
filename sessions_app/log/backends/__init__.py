"""One storage interface, a module per database (postgres.py, sqlite.py).

Each backend module provides the same five things:

- `fetch(sql, params)`: run one statement on Django's connection (joining
  the current transaction, or autocommitting outside one) and return its rows
  as dicts keyed by column name;
- `fetch_unprepared(sql, params)`: the same for a statement whose text varies;
- `append_run(run)`: the UPDATE-then-INSERT of one run of events (see
  writer.Run), returning one row per event (`seq`, plus the workload columns
  when the run releases the lease), or no row when the session row did not
  match (missing, fence superseded, guard failed);
- `ONE_STATEMENT`: whether append_run is a single statement, so that it may
  run in autocommit (its own transaction, one round trip);
- `claim_extras`: whether the lease claim can read the agent's profile and
  the open turn's view in its own statement.

Nothing outside the log package runs SQL through these: prepared statements
and raw rows stay in here.
"""

from __future__ import annotations

from types import ModuleType

from django.db import connection

from sessions_app.log.backends import postgres, sqlite


def current() -> ModuleType:
    return postgres if connection.vendor == "postgresql" else sqlite
