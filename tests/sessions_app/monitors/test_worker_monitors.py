"""kill -9 at every phase of a monitor's period, with real Celery worker
processes (their clock threads run the monitors) on PostgreSQL: mid-scan,
after the intent, after the send and before the receipt. Counted at the
receiver: nothing is missed and nothing is delivered twice."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from sessions_app.models import DeliveryLedger, Edition, Monitor
from sessions_app.runtime.effects import effects, effects_audit
from sessions_app.services import monitors
from tests.sessions_app.monitors.conftest import EditionReceiver, FeedServer

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ENV = {
    "TERRET_SCHEDULE_POLL_SECONDS": "0.2",
    "TERRET_ALLOW_PRIVATE_HOSTS": "127.0.0.1",
    "TERRET_MONITOR_LEASE_SECONDS": "2",
    "TERRET_MONITOR_RESEND_SECONDS": "0",
}


def wait_for(what: Callable[[], Any], timeout: float = 40.0, label: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {label or what}")


def due(m: Monitor) -> None:
    Monitor.objects.filter(id=m.id).update(due_at=timezone.now() - timedelta(seconds=1))


def confirmed(m: Monitor, n: int) -> bool:
    return Edition.objects.filter(monitor=m, status="confirmed").count() >= n


@pytest.mark.parametrize(
    "point",
    ["monitor_scan", "monitor_intent", "monitor_sent"],
)
def test_kill_9_at_each_phase_loses_nothing_and_sends_nothing_twice(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, start_worker: Any, point: str
) -> None:
    body = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed_server.url}],
        "destination": {"kind": "webhook", "url": edition_receiver.url},
    }
    m, _ = monitors.create(session.id, body, by="owner")
    feed_server.page_size = 2
    feed_server.add(5)
    doomed = start_worker(name="doomed", TERRET_FAILPOINTS=f"{point}:monitor=60", **ENV)
    due(m)
    if point == "monitor_scan":
        wait_for(lambda: feed_server.requests >= 3, label="the scan's pages")
    elif point == "monitor_intent":
        wait_for(lambda: Edition.objects.filter(monitor=m, status="posting").exists(), label="the intent")
    else:
        wait_for(lambda: len(edition_receiver.accepted) == 1, label="the send")
    time.sleep(0.3)  # inside the failpoint's pause
    doomed.kill()
    assert not Edition.objects.filter(monitor=m, status="confirmed").exists()

    start_worker(name="heir", **ENV)
    wait_for(lambda: confirmed(m, 1), label="the edition confirmed by the heir")
    e = Edition.objects.get(monitor=m, status="confirmed")
    assert len(e.items) == 5
    assert e.attempts == (2 if point in ("monitor_intent", "monitor_sent") else 1)
    # A second period on the heir: new items only.
    feed_server.add(2)
    due(m)
    wait_for(lambda: confirmed(m, 2), label="the second edition")
    counted = Counter(edition_receiver.items())
    assert counted == Counter(dict.fromkeys(feed_server.versions(), 1))  # each item once, at the receiver
    assert len(edition_receiver.accepted) == 2
    assert DeliveryLedger.objects.filter(monitor=m).count() == 7
    assert not Edition.objects.filter(monitor=m).exclude(status="confirmed").exists()
    # The effect ledger holds: a send cut off by the kill is superseded by the heir's re-send under the
    # same key (the webhook honours it), each edition one call with one receipt.
    audit = effects_audit(session.id)
    assert audit.ok, audit.problems
    cut = 1 if point in ("monitor_intent", "monitor_sent") else 0
    assert audit.counts == {"done": 2, "calls": 2, **({"superseded": 1} if cut else {})}
    assert {x.idempotency_key for x in effects(session.id)} == {str(x.id) for x in Edition.objects.filter(monitor=m)}


def test_two_workers_many_periods_with_faults_each_item_once(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, start_worker: Any
) -> None:
    """Two worker processes' clocks race for one monitor through twenty periods, the receiver
    dropping connections and the feed answering 429s now and then: each item version reaches the
    receiver once."""
    import random

    rnd = random.Random(7)
    body = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed_server.url}],
        "destination": {"kind": "webhook", "url": edition_receiver.url},
    }
    m, _ = monitors.create(session.id, body, by="owner")
    feed_server.page_size = 3
    start_worker(name="a", **ENV)
    start_worker(name="b", **ENV)
    for n in range(1, 21):
        feed_server.add(rnd.randint(0, 3))
        feed_server.faults = [rnd.choice([None, None, "429"])]
        edition_receiver.modes = [rnd.choice([None, None, None, "drop"])]
        due(m)
        wait_for(lambda n=n: Monitor.objects.get(id=m.id).periods >= n, label=f"period {n}")
    feed_server.faults, edition_receiver.modes = [], []
    due(m)
    wait_for(
        lambda: (
            not Edition.objects.filter(monitor=m, status__in=("prepared", "posting", "unknown")).exists()
            and Monitor.objects.get(id=m.id).periods >= 21
        ),
        label="everything settled",
    )
    due(m)  # one more period picks up what the last held edition kept pending
    wait_for(lambda: Monitor.objects.get(id=m.id).periods >= 22, label="the last period")
    wait_for(
        lambda: not Edition.objects.filter(monitor=m, status__in=("prepared", "posting", "unknown")).exists(),
        label="the last edition settled",
    )
    counted = Counter(edition_receiver.items())
    assert set(counted.values()) == {1}, [k for k, v in counted.items() if v > 1]
    assert set(counted) == feed_server.versions()
    assert DeliveryLedger.objects.filter(monitor=m).count() == len(counted)
    audit = effects_audit(session.id)
    assert audit.ok, audit.problems
