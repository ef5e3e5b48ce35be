"""Celery tasks: thin adapters that take ids, are safe to run twice, and call one service."""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import connection

from sessions_app.llm import openai
from sessions_app.runtime.dispatch import DRIVE_TASK, SWEEP_TASK
from sessions_app.runtime.drive import drive
from sessions_app.runtime.sweep import sweep

log = logging.getLogger(__name__)


@shared_task(name=DRIVE_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def drive_session(session_id: str) -> str:
    try:
        return str(drive(session_id))
    finally:
        connection.close()  # hand the pooled connection back between tasks


@shared_task(name=SWEEP_TASK, ignore_result=True)
def sweep_sessions(at_start: bool = False) -> int:
    ids = sweep(at_start=at_start)
    for sid in ids:
        drive_session.delay(sid)
    return len(ids)


def _sweep_loop() -> None:
    stop = threading.Event()
    first = True
    while True:
        try:
            sweep_sessions(at_start=first)
        except Exception:
            log.exception("sweep failed")
        finally:
            connection.close()
        if first:
            # After the first sweep, not before it: recovering a dead
            # worker's turns should not wait for imports it may not need.
            first = False
            try:
                warm_up()
            except Exception:
                log.exception("warm-up failed; the first turns import what they need themselves")
        stop.wait(settings.TERRET_SWEEP_SECONDS)


def warm_up() -> None:
    """Import what the first turn would otherwise import under its feet (the
    MCP SDK and its pydantic models take about half a second), so a burst of
    turns on a fresh worker does not queue behind the import lock."""
    for module in (
        "httpcore",  # httpx imports its transport only when a client is built
        "h11",
        "encodings.idna",  # httpx, for the first URL with a host name
        "psycopg_pool",  # Django opens its pool on the first query
        "sessions_app.tools.mcp",
    ):
        importlib.import_module(module)
    openai.tls_context()  # the CA bundle, loaded once for every thread's client


@worker_ready.connect
def _start_sweeper(**_: Any) -> None:
    # Every worker sweeps at start (recovering turns a dead worker left) and
    # then periodically; concurrent sweeps are harmless because drives are
    # serialized by the session lease.
    threading.Thread(target=_sweep_loop, name="terret-sweeper", daemon=True).start()
