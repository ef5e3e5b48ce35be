"""This worker process's liveness, as PostgreSQL itself reports it.

A lease names the process holding it (`Session.lease_process`, written by
the claim). Each worker process holds a session-level advisory lock
(lease.LIVENESS_NS, its key) on a psycopg connection of its own, outside
Django's pool, and registers a WorkerProcess row under that key. PostgreSQL
frees the lock the moment the process dies, kill -9 included (the kernel
closes its socket and the backend ends), so:

- a claim takes a lease whose process's lock is free at once
  (log/leases.py), and the sweep counts such a turn as nobody's (sweep.py);
- a poller thread, every TERRET_LIVENESS_POLL_SECONDS and on this same
  connection, deletes the WorkerProcess rows whose lock is free (one
  conditional DELETE, so exactly one process wins each) and wakes the
  sessions whose lease the dead process held. Another worker resumes its
  turns within about a poll rather than a lease TTL, and the TTL stays
  long, so no renewal storm.

A paused process (SIGSTOP) keeps its lock: only its lease's expiry lets its
turns go, and when it wakes its appends are fenced on the lease generation
and write nothing. A host that vanishes without closing its sockets keeps
its locks until the server's TCP keepalive gives up (set short on this
connection); the lease TTL covers that case as well.

If the connection breaks (a database restart), no key is held: claims record
none (their leases are freed by expiry only), and the poller reconnects with
backoff and takes the same key again if it is free. After reconnecting it
reaps nobody for RECONNECT_GRACE_SECONDS: a restart broke every process's
connection at once, and the others need a moment to take their keys again
before their turns count as orphaned. While the process
drains (SIGTERM) the poller wakes nothing: the workers that stay do that.
Liveness is PostgreSQL only; on SQLite `start` does nothing. Its connection
must be a session of its own on the server (direct, or a session-mode
pooler): behind a transaction-mode pooler the lock would outlive the process
or leave it early, which the lease's fence keeps safe but not fast.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from sessions_app.models import Session, WorkerProcess
from sessions_app.runtime import codever, lease, lifecycle

log = logging.getLogger(__name__)

Wake = Callable[[str], None]

RECONNECT_FIRST_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 2.0
RECONNECT_GRACE_SECONDS = 5.0
KEY_ATTEMPTS = 20
MAX_KEY = 2**31 - 1

NS = lease.LIVENESS_NS
_WORKERS = WorkerProcess._meta.db_table
_SESSIONS = Session._meta.db_table

_TAKE = "SELECT pg_try_advisory_lock(%s::int4, %s::int4)"
_UNLOCK = "SELECT pg_advisory_unlock(%s::int4, %s::int4)"
# A row under our key is ours unless another process (now dead: we hold the
# lock) left it; then we give the key up and let the poller reap that row.
_REGISTER = (
    f"INSERT INTO {_WORKERS} AS w (key, host, pid, started_at, build, event_versions) "
    "VALUES (%s, %s, %s, now(), %s, %s::jsonb) "
    "ON CONFLICT (key) DO UPDATE SET started_at = w.started_at WHERE w.host = EXCLUDED.host AND w.pid = EXCLUDED.pid "
    "RETURNING w.id"
)
_REAP = f"DELETE FROM {_WORKERS} w WHERE {lease.process_gone('w.key')} RETURNING w.key, w.host, w.pid"
# Whatever the dead process held a lease on, unless it waits for something
# other than a worker (a verdict, an operator, a stimulus, an agent slot): the drive
# finds out what is owed.
_HELD_BY = (
    f"SELECT id FROM {_SESSIONS} WHERE lease_process = ANY(%s) AND lease_owner <> '' "
    "AND pending_approvals = 0 AND unknown_effects = 0 AND waiting_tasks = 0 "
    "AND blocked_seq IS NULL AND waiting_seq IS NULL "
    "AND suspended_seq IS NULL"
)
_UNREGISTER = f"DELETE FROM {_WORKERS} WHERE key = %s AND pid = %s"


def conninfo() -> dict[str, Any]:
    """psycopg.connect's arguments for the default database, as Django would
    connect, plus keepalives: the server frees a silent host's locks within
    about 30 s, and this side notices a silent server as fast."""
    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    server = "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
    params["options"] = f"{params['options']} {server}" if params.get("options") else server
    params.setdefault("connect_timeout", 5)
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 10)
    params.setdefault("keepalives_interval", 5)
    params.setdefault("keepalives_count", 3)
    params.setdefault("tcp_user_timeout", 10_000)
    params.setdefault("application_name", "terret-liveness")
    return params


class _Liveness:
    """The state of one process: its connection, its key and the poller."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = 0  # the process that started it (0: not started)
        self.conn: psycopg.Connection[Any] | None = None
        self.key: int | None = None  # held now (the connection is up)
        self.wanted: int | None = None  # the key to take again after a reconnect
        self.wake: Wake | None = None
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.quiet_until = 0.0  # monotonic: no reaping before then (just reconnected)

    # -- the lock

    def connect(self) -> None:
        conn = psycopg.connect(**conninfo(), autocommit=True)
        try:
            key = self._take(conn)
        except BaseException:
            conn.close()
            raise
        with self.lock:
            self.conn, self.key = conn, key
            if self.wanted is not None and self.wanted != key:
                log.warning("liveness key %s was taken; this process is now %s", self.wanted, key)
            self.wanted = key
        log.info("liveness: process %s holds key %s", os.getpid(), key)

    def _take(self, conn: psycopg.Connection[Any]) -> int:
        rng = random.SystemRandom()
        for attempt in range(KEY_ATTEMPTS):
            key = self.wanted if attempt == 0 and self.wanted is not None else rng.randint(1, MAX_KEY)
            if not _one(conn, _TAKE, [NS, key]):
                continue  # another live process holds it
            row = [key, socket.gethostname(), os.getpid(), *codever.registration()]
            if conn.execute(_REGISTER, row).fetchone() is not None:
                return key
            conn.execute(_UNLOCK, [NS, key])
        raise RuntimeError(f"no free liveness key after {KEY_ATTEMPTS} attempts")

    def drop(self) -> None:
        """The connection is gone (or going): no key is held from now on."""
        with self.lock:
            conn, self.conn, self.key = self.conn, None, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the liveness connection failed", exc_info=True)

    # -- the poller

    def run(self) -> None:
        delay = RECONNECT_FIRST_SECONDS
        while not self.stopping.is_set():
            if self.conn is None:
                try:
                    self.connect()
                    delay = RECONNECT_FIRST_SECONDS
                    self.quiet_until = time.monotonic() + RECONNECT_GRACE_SECONDS
                except Exception as exc:
                    log.warning("liveness: cannot take a key (%s); retrying in %.1fs", exc, delay)
                    self.stopping.wait(delay)
                    delay = min(delay * 2, RECONNECT_MAX_SECONDS)
                    continue
            if not lifecycle.draining.is_set() and time.monotonic() >= self.quiet_until:
                try:
                    self.poll()
                except psycopg.Error as exc:
                    log.warning("liveness: the connection failed (%s); reconnecting", exc)
                    self.drop()
                    continue
                except Exception:
                    log.exception("liveness poll failed")
            self.stopping.wait(settings.TERRET_LIVENESS_POLL_SECONDS)

    def poll(self) -> list[str]:
        """Reap the rows of dead processes and wake what they held; the ids woken."""
        conn = self.conn
        if conn is None:
            return []
        gone = conn.execute(_REAP).fetchall()
        if not gone:
            return []
        keys = [int(key) for key, _, _ in gone]
        ids = [str(sid) for (sid,) in conn.execute(_HELD_BY, [keys]).fetchall()]
        names = ", ".join(f"{host}:{pid}" for _, host, pid in gone)
        level = logging.WARNING if ids else logging.INFO  # a process that held nothing ended quietly
        log.log(level, "liveness: worker process(es) %s are gone; waking %d of their sessions", names, len(ids))
        wake = self.wake
        for sid in ids:
            if wake is None or lifecycle.draining.is_set():
                break  # the sweep of a worker that stays finds the rest
            try:
                wake(sid)
            except Exception:
                log.exception("liveness: waking %s failed; the sweep will", sid)
        return ids

    def stop(self) -> None:
        self.stopping.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=settings.TERRET_LIVENESS_POLL_SECONDS + 10)
        with self.lock:
            conn, key = self.conn, self.key
            self.key = None  # claims from here on record no key
        if conn is not None and key is not None:
            try:
                conn.execute(_UNREGISTER, [key, os.getpid()])
                conn.execute(_UNLOCK, [NS, key])
            except Exception:
                log.debug("releasing the liveness key failed; closing frees it", exc_info=True)
        self.drop()


def _one(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> Any:
    row = conn.execute(sql, params).fetchone()
    return row[0] if row is not None else None


_state = _Liveness()
_starting = threading.Lock()


def current_key() -> int | None:
    """This process's liveness key while it holds the lock; None otherwise
    (not started, SQLite, the connection is down, a forked child before its
    own start)."""
    state = _state
    return state.key if state.pid == os.getpid() else None


def start(wake: Wake) -> bool:
    """Take this process's liveness lock and start its poller, which wakes
    a dead process's sessions with `wake(session_id)`. Idempotent within a
    process, and again after a fork or a stop. False where liveness is off
    (not PostgreSQL)."""
    global _state
    if connection.vendor != "postgresql":
        return False
    with _starting:
        if _state.pid == os.getpid() and not _state.stopping.is_set():
            _state.wake = wake
            return True
        state = _state = _Liveness()
        state.pid, state.wake = os.getpid(), wake
        lease.use_process_key(current_key)
        try:
            # Here rather than on the poller thread: the first claims should record the key.
            state.connect()
        except Exception as exc:
            log.warning("liveness: cannot take a key yet (%s); the poller retries", exc)
        state.thread = threading.Thread(target=state.run, name="terret-liveness", daemon=True)
        state.thread.start()
    return True


def stop() -> None:
    """Give the key up (clean shutdown): the row goes, the lock is released."""
    state = _state
    if state.pid == os.getpid():
        state.stop()


def poll_now() -> list[str]:
    """One poll on this process's connection (tests); the session ids woken."""
    return _state.poll() if current_key() is not None else []


def _after_fork_in_child() -> None:
    """A forked child starts from nothing (worker_process_init starts it again).
    Its copy of the parent's connection must never speak: closing it would end
    the parent's session and free the parent's lock, so its socket is pointed
    at /dev/null first."""
    global _state, _starting
    conn = _state.conn
    if conn is not None:
        try:
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, conn.fileno())
            os.close(null)
        except Exception:  # noqa: S110 - nothing to do about it in a fresh child
            pass
    _state, _starting = _Liveness(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(stop)
