"""The broker transport (terret_site/broker.py): kombu's Redis transport with
one redis client per channel, shared by every thread that acks or publishes
through the channel. Real Redis; the worker tests run real Celery workers on
it (late acks included)."""

from __future__ import annotations

import threading
import uuid

import pytest

from terret_site import broker

pytestmark = pytest.mark.redis


def test_celery_takes_the_transport_and_a_channel_reuses_one_client() -> None:
    from terret_site.celery import app

    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, broker.Transport)
        channel = conn.default_channel
        assert isinstance(channel, broker.Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        given = object()
        with channel.conn_or_acquire(given) as passed:
            assert passed is given  # a caller's own client is used as before


def test_threads_share_the_channels_client_without_losing_a_command() -> None:
    """kombu acks from the worker's pool threads on the consumer's channel:
    with the shared client they run pipelines concurrently, as its QoS does."""
    from terret_site.celery import app

    key = f"terret-test-broker-{uuid.uuid4().hex}"
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                barrier.wait(5)
                for _ in range(50):
                    with channel.conn_or_acquire() as client:
                        client.pipeline().incr(key).expire(key, 60).execute()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        with channel.conn_or_acquire() as client:
            total = int(client.get(key))
            client.delete(key)
    assert errors == []
    assert total == 8 * 50
