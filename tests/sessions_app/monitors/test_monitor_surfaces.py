"""Where a person meets monitors: the session page's panel (coverage, last
editions, next run), /ops/ (failed or partial coverage, unknown and held
editions) and /metrics (editions by status, items delivered, scans by
coverage)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from sessions_app.models import Monitor
from sessions_app.monitors import run
from sessions_app.services import monitors
from tests.sessions_app.monitors.conftest import EditionReceiver, FeedServer

pytestmark = pytest.mark.django_db


def period(m: Monitor) -> None:
    Monitor.objects.filter(id=m.id).update(due_at=timezone.now() - timedelta(seconds=1))
    run.tick()


def test_panel_ops_and_metrics(
    session: Any,
    owner: Any,
    make_user: Any,
    feed_server: FeedServer,
    edition_receiver: EditionReceiver,
) -> None:
    body = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed_server.url, "partition": "news"}],
        "destination": {"kind": "webhook", "url": edition_receiver.url},
    }
    m, _ = monitors.create(session.id, body, by="owner")
    feed_server.add(2)
    period(m)
    feed_server.faults = ["429"]
    edition_receiver.modes = ["drop"]
    period(m)  # coverage failed (429), and its edition (naming the gap) is unknown

    client = Client()
    client.force_login(owner)
    page = client.get(f"/sessions/{session.id}/").content.decode()
    assert f'id="monitor-{m.id}"' in page
    assert "HTTP 429" in page and "[news]" in page
    assert "edition-confirmed" in page and "edition-unknown" in page
    assert "next <time" in page

    stranger = Client()
    stranger.force_login(make_user("stranger"))
    assert stranger.get(f"/sessions/{session.id}/").status_code == 404

    ops = Client()
    ops.force_login(make_user("ops", is_staff=True))
    console = ops.get("/ops/").content.decode()
    assert 'id="h-monitors"' in console
    assert "[news] failed" in console and "period 2 unknown" in console

    metrics = ops.get("/metrics").content.decode()
    assert 'terret_monitor_editions{status="confirmed"} 1.0' in metrics
    assert 'terret_monitor_editions{status="unknown"} 1.0' in metrics
    assert "terret_monitor_items_delivered_total 2.0" in metrics
    assert 'terret_monitor_scans_total{coverage="failed"} 1.0' in metrics
