"""The Celery broker transport: kombu's Redis transport, with one client per channel.

kombu's Redis channel builds a new `redis.Redis` object for every operation
not handed a client (`Channel.conn_or_acquire`): each publish, and both halves
of the late-ack bookkeeping (`QoS.append` when a message is delivered, the
removal when it is acked). With redis-py 8 building a client is costly
(argument normalisation, a copy of the callback table); on a worker taking
hundreds of wake-ups a second it was about half the CPU of the consumer
thread, the thread every delivery waits on (bench/turns.py (b), py-spy).

A `redis.Redis` object holds no connection of its own: each command borrows
one from the channel's pool and gives it back, and pipelines are built per
use, so one client per channel is safe to share between threads and does the
same Redis work. Nothing else of the transport changes.

Selected by CELERY_BROKER_TRANSPORT (terret_site/settings.py) whenever the
broker is Redis; kombu takes an explicit transport class over the URL scheme.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.worker import consumer as celery_consumer
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _shared_client: Any = None
    _shared_lock = threading.Lock()

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None:
            with self._shared_lock:
                if self._shared_client is None:
                    self._shared_client = self._create_client()  # type: ignore[attr-defined]  # not in the stubs
                shared = self._shared_client
        yield shared


class Transport(kombu_redis.Transport):
    Channel = Channel


class Consumer(celery_consumer.Consumer):
    """The worker's consumer, reconnecting to a broker that comes back within
    about a second. Celery passes kombu's default waits (2, 4, 6 … up to 30 s
    between attempts), so a worker could stay away for half a minute after a
    short Redis outage while the turns it should run wait. Attempts every
    half second to one second cost a refused connection each, nothing more.
    Selected by CELERY_WORKER_CONSUMER (terret_site/settings.py).

    Without `mingle`, however the worker is started: at start (and at every
    reconnection) mingle asks the other workers for their revoked task ids
    and logical clocks and waits a full second for their replies, before
    the first task is taken. Terret revokes no task and reads no logical
    clock (a drive is safe to run twice; the lease decides), so that second
    bought nothing, and on a fresh worker recovering a dead one's turns it
    was on the recovery path (bench/peers.py: kill -9, a freshly started
    process recovers)."""

    RECONNECT = {"interval_start": 0.5, "interval_step": 0.5, "interval_max": 1.0}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # worker_options (the worker's, by keyword) are handed to every
        # consumer step; the Mingle step reads this one to disable itself.
        kwargs["worker_options"] = {**(kwargs.get("worker_options") or {}), "without_mingle": True}
        super().__init__(*args, **kwargs)

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(conn.ensure_connection, **self.RECONNECT)
        try:
            return super().ensure_connected(conn)
        finally:
            del conn.ensure_connection  # the instance attribute; the method shows through again
