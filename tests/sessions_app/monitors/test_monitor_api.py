"""The monitors' API: POST /api/sessions/{id}/monitors, GET /api/monitors/{id}
(coverage, next_due_at), GET .../editions, DELETE, the edition resolution;
one access rule (a second user sees nothing of the first's); and the agent's
monitor.* tools through their backend."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from sessions_app.models import Edition, Monitor
from sessions_app.monitors import run
from sessions_app.tools import monitors as monitor_tools
from tests.sessions_app.apiutil import bearer, token_for
from tests.sessions_app.monitors.conftest import EditionReceiver, FeedServer

pytestmark = pytest.mark.django_db


def post(client: Client, path: str, body: Any, auth: dict[str, str]) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json", **auth)  # type: ignore[arg-type]


def test_create_read_editions_cancel(
    session: Any, owner: Any, make_user: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    client = Client()
    auth = bearer(token_for(owner))
    body = {
        "schedule": {"every_seconds": 3600, "misfire": "run_once"},
        "sources": [{"kind": "feed", "url": feed_server.url, "partition": "news"}],
        "destination": {"kind": "webhook", "url": edition_receiver.url},
        "quiet": "suppress",
        "idempotency_key": "k1",
    }
    r = post(client, f"/api/sessions/{session.id}/monitors", body, auth)
    assert r.status_code == 201, r.content
    made = r.json()
    assert made["secret"] and made["next_due_at"]
    assert made["coverage"] == [
        {
            "source": feed_server.url,
            "partition": "news",
            "coverage": None,
            "period": None,
            "pages": 0,
            "items": 0,
            "error": "",
            "at": None,
            "evidence": {},
        }
    ]
    again = post(client, f"/api/sessions/{session.id}/monitors", body, auth)
    assert again.status_code == 200 and again.json()["id"] == made["id"] and again.json()["secret"] is None
    feed_server.add(2)
    Monitor.objects.filter(id=made["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    run.tick()
    got = client.get(f"/api/monitors/{made['id']}", **auth)  # type: ignore[arg-type]
    assert got.status_code == 200
    assert got.json()["coverage"][0]["coverage"] == "complete"
    assert got.json()["delivered_items"] == 2
    eds = client.get(f"/api/monitors/{made['id']}/editions", **auth)  # type: ignore[arg-type]
    [e] = eds.json()["editions"]
    assert e["status"] == "confirmed" and e["receipt"] == f"rcpt-{e['id']}" and len(e["items"]) == 2
    assert set(e["items"][0]) == {"source", "id", "version", "title", "url"}
    # A second user sees nothing of the first's.
    stranger = bearer(token_for(make_user("stranger")))
    for path in (f"/api/monitors/{made['id']}", f"/api/monitors/{made['id']}/editions"):
        assert client.get(path, **stranger).status_code == 404  # type: ignore[arg-type]
    assert client.delete(f"/api/monitors/{made['id']}", **stranger).status_code == 404  # type: ignore[arg-type]
    assert post(client, f"/api/sessions/{session.id}/monitors", body, stranger).status_code == 404
    gone = client.delete(f"/api/monitors/{made['id']}", **auth)  # type: ignore[arg-type]
    assert gone.status_code == 200 and gone.json()["status"] == "cancelled" and gone.json()["next_due_at"] is None
    Monitor.objects.filter(id=made["id"]).update(due_at=timezone.now() - timedelta(seconds=1))
    assert run.tick() == 0  # a cancelled monitor runs no more


def test_bad_bodies_are_4xx_and_change_nothing(session: Any, owner: Any, feed_server: FeedServer) -> None:
    client = Client()
    auth = bearer(token_for(owner))
    good = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed_server.url}],
        "destination": {"kind": "webhook", "url": feed_server.url},
    }
    for bad in (
        {**good, "sources": []},
        {**good, "sources": [{"kind": "mcp", "url": feed_server.url}]},
        {**good, "destination": {"kind": "webhook", "url": "http://10.0.0.1/x"}},
        {**good, "schedule": {"every_seconds": 5}},
        {**good, "extra": 1},
        {**good, "destination": {"kind": "webhook"}},
    ):
        r = post(client, f"/api/sessions/{session.id}/monitors", bad, auth)
        assert 400 <= r.status_code < 500, (bad, r.content)
    assert not Monitor.objects.exists()


def test_operator_resolves_an_unknown_email_edition(
    session: Any, owner: Any, feed_server: FeedServer, settings: Any
) -> None:
    settings.TERRET_OWNER_MAY_RESOLVE = True
    client = Client()
    auth = bearer(token_for(owner))
    body = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed_server.url}],
        "destination": {"kind": "email", "to": ["a@example.org"]},
    }
    made = post(client, f"/api/sessions/{session.id}/monitors", body, auth).json()
    m = Monitor.objects.get(id=made["id"])
    feed_server.add(1)
    e = Edition.objects.create(monitor=m, period=1, destination="email:a@example.org", status="unknown", items=[])
    path = f"/api/monitors/{m.id}/editions/{e.id}/resolve"
    assert post(client, path, {"action": "done"}, auth).status_code == 400  # confirmation needs a receipt
    r = post(client, path, {"action": "done", "receipt": "<id@smtp>"}, auth)
    assert r.status_code == 200 and r.json()["status"] == "confirmed"
    assert post(client, path, {"action": "failed"}, auth).status_code == 409


def test_agent_tools_reach_the_service(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    backend = monitor_tools._monitors()
    spec = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed_server.url}],
        "destination": {"kind": "webhook", "url": edition_receiver.url},
    }
    made = backend.create(session.id, spec, by="agent", key="call-1")
    assert backend.create(session.id, spec, by="agent", key="call-1")["id"] == made["id"]  # a replay: the same
    assert [m["id"] for m in backend.list(session.id)] == [made["id"]]
    assert backend.cancel(session.id, made["id"], by="agent")["status"] == "cancelled"
    defs = {d.name: d for d in monitor_tools.DEFINITIONS}
    assert defs["monitor.create"].approval == "policy" and defs["monitor.cancel"].approval == "policy"
