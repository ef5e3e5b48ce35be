"""Celery tasks: thin adapters that take ids, are safe to run twice, and call one service.

The worker's lifecycle is wired here too, from Celery's signals:

- at start, the process takes its liveness lock (runtime/liveness.py), so a
  kill -9 frees its leases at once, and starts the sweeper, the schedules'
  clock and the notifications' sender (sessions_app/notify/delivery.py);
- on SIGTERM (warm shutdown) it drains: drives claim nothing new and a
  running turn hands its session over at its next commit; each handed-off
  session gets a fresh wake-up here, for a worker that stays. Celery stops
  consuming, waits for the running tasks and exits; an unacked message it
  had not started goes back to the queue (acks_late), so nothing is lost,
  and nothing is run twice (every step is committed before it is handed on);
- at exit it gives its liveness key up.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from typing import Any

from celery import shared_task
from celery.signals import worker_init, worker_process_init, worker_ready, worker_shutdown, worker_shutting_down
from celery.worker import state as worker_state
from django.conf import settings
from django.db import connection

from sessions_app.llm import openai
from sessions_app.notify import delivery
from sessions_app.runtime import counters, lifecycle, liveness, schedules
from sessions_app.runtime.dispatch import DRIVE_TASK, RUN_TASK, SWEEP_TASK, send_drive
from sessions_app.runtime.drive import drive
from sessions_app.runtime.outcomes import Outcome
from sessions_app.runtime.owned import supervise
from sessions_app.runtime.sweep import note_woken, sweep, sweep_round

log = logging.getLogger(__name__)


@shared_task(name=DRIVE_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def drive_session(session_id: str, sent_at: float | None = None) -> str:
    if sent_at is not None:  # from the wake-up's send to this worker taking it
        counters.add("queue_waits")
        counters.add("queue_wait_ms", max(0, int((time.time() - sent_at) * 1000)))
    try:
        outcome = drive(session_id)
    finally:
        connection.close()  # hand the pooled connection back between tasks
    if outcome is Outcome.HANDED_OFF:
        send_drive(session_id)  # this process is draining: a worker that stays takes the session
    elif outcome is Outcome.LEFT:
        # Its log is newer than this code reads: for a worker that reads it
        # (runtime/codever.py). Not at once, so older workers pass it along slowly.
        send_drive(session_id, countdown=LEFT_RESEND_SECONDS)
    return str(outcome)


LEFT_RESEND_SECONDS = 0.5


@shared_task(name=RUN_TASK, ignore_result=True)
def run_task(task_id: str) -> str:
    # The supervision runs on a thread of its own (a long command holds no
    # worker slot); a second start finds the task claimed and does nothing.
    supervise.start(task_id)
    return "started"


@shared_task(name=SWEEP_TASK, ignore_result=True)
def sweep_sessions(at_start: bool = False) -> int:
    ids = sweep(at_start=at_start)
    for sid in ids:
        drive_session.delay(sid)
    return len(ids)


@shared_task(name=delivery.NOTIFY_TASK, ignore_result=True)
def send_notifications(ids: list[int]) -> dict[int, str]:
    # Safe to run twice: each send starts with a claim (sessions_app/notify/outbox.py).
    return delivery.deliver_many([int(i) for i in ids])


def _sweep_loop() -> None:
    stop = threading.Event()
    first = True
    while True:
        if not lifecycle.draining.is_set():  # a draining worker wakes nothing
            _sweep_round(first)
        if first:
            # After the first sweep, not before it: recovering a dead
            # worker's turns should not wait for imports it may not need.
            first = False
            _wait_idle()
            try:
                warm_up()
            except Exception:
                log.exception("warm-up failed; the first turns import what they need themselves")
        stop.wait(settings.TERRET_SWEEP_SECONDS)


# How long the MCP SDK's import waits for a fresh worker's first tasks.
WARM_UP_WAIT_SECONDS = 5.0


def _wait_idle(limit: float = WARM_UP_WAIT_SECONDS) -> None:
    """Until this worker runs no task (at most `limit` seconds). The MCP
    SDK's import is half a second of CPU under the GIL: started beside a
    fresh worker's first tasks (the turns it recovers from a dead worker,
    woken at start) it would take half of their CPU while they run."""
    deadline = time.monotonic() + limit
    time.sleep(0.1)  # the wake-ups sent at start reach the consumer first
    while (worker_state.active_requests or worker_state.reserved_requests) and time.monotonic() < deadline:
        time.sleep(0.05)


def _sweep_round(first: bool) -> None:
    sweep_round(at_start=first, wake=send_drive)


def warm_up() -> None:
    """Import what the first turn would otherwise import under its feet (the
    MCP SDK and its pydantic models take about half a second), so a burst of
    turns on a fresh worker does not queue behind the import lock. The rest
    was warmed at worker_init (warm_model_path)."""
    importlib.import_module("sessions_app.tools.mcp")


def warm_model_path(database: bool = True) -> None:
    """What every turn's first step needs, ready before the worker takes its
    first task: a fresh worker recovering a dead one's turns (docs/runtime.md,
    liveness) would otherwise pay for it inside the first recovered turn. The
    modules of the model call, the CA bundle of every thread's model client,
    and the database pool opened (its first connections made). Tens of
    milliseconds; the MCP SDK (half a second) waits for warm_up, after the
    first sweep."""
    for module in (
        "httpcore",  # httpx imports its transport only when a client is built
        "h11",
        "encodings.idna",  # httpx, for the first URL with a host name
        "psycopg_pool",  # Django opens its pool on the first query
    ):
        importlib.import_module(module)
    started = time.perf_counter()
    openai.tls_context()  # the CA bundle, loaded once for every thread's client
    if database:
        connection.ensure_connection()  # opens the pool (its min_size connections fill in the background)
        connection.close()  # back to the pool, for the first task's thread
    log.info("warm-up: the model path and the database pool ready in %.0f ms", (time.perf_counter() - started) * 1000)


def _wake_gone(sid: str) -> None:
    note_woken(sid)  # before the message: the start sweep must see it
    send_drive(sid)


def _start_liveness() -> None:
    try:
        liveness.start(_wake_gone)
    except Exception:
        log.exception("liveness did not start; leases of this process are freed by their expiry only")


def _forks(worker: Any) -> bool:
    """Whether this worker's pool forks children (prefork, Celery's default):
    their parent must not open database connections they would inherit."""
    pool = getattr(worker, "pool_cls", None) or "prefork"
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    return "prefork" in name


@worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    # Before the pool takes tasks, so that every claim records the key.
    _start_liveness()
    try:
        # Before the consumer starts: the first claim finds it ready.
        warm_model_path(database=not _forks(sender))
    except Exception:
        log.exception("warm-up failed; the first turn builds what it needs itself")


@worker_process_init.connect
def _on_worker_process_init(**_: Any) -> None:
    # A prefork child is a process of its own: its own key (liveness resets after fork).
    _start_liveness()


@worker_ready.connect
def _start_sweeper(**_: Any) -> None:
    # Every worker sweeps at start (recovering turns a dead worker left) and
    # then periodically; concurrent sweeps are harmless because drives are
    # serialized by the session lease.
    _start_liveness()  # idempotent: worker_init normally did it
    threading.Thread(target=_sweep_loop, name="terret-sweeper", daemon=True).start()
    schedules.start_clock()  # due schedules, claimed with SKIP LOCKED (runtime/schedules.py)
    delivery.start_sender()  # due notifications, retries, a dead sender's claims (docs/notifications.md)


@worker_shutting_down.connect
def _drain(**_: Any) -> None:
    # Sent by the SIGTERM handler of the main process, before Celery stops consuming.
    lifecycle.draining.set()


@worker_shutdown.connect
def _release_liveness(**_: Any) -> None:
    # After the pool has finished its tasks: every lease was handed over. An
    # owned task's supervision runs on a thread of its own, not in the pool:
    # its settle (a receipt in the log) comes first, while the process is live.
    left = supervise.wait_settled(SUPERVISIONS_SETTLE_SECONDS)
    if left:
        log.warning("shutdown: %d task supervisions still running; the reaper settles them", left)
    liveness.stop()


# A supervision stops at its next poll (TERRET_TASK_POLL_SECONDS) once the
# drain begins, so its settle needs well under this; the bound keeps a stuck
# one from holding the shutdown.
SUPERVISIONS_SETTLE_SECONDS = 5.0
