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

from sessions_app.models import DeliveryLedger, Edition, Monitor
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


def unknown_webhook_edition(
    client: Client, session: Any, auth: dict[str, str], feed: FeedServer, receiver: EditionReceiver
) -> tuple[Monitor, Edition]:
    """A monitor made through the API whose first edition the receiver took and then dropped the
    connection on: its outcome is unknown."""
    body = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed.url}],
        "destination": {"kind": "webhook", "url": receiver.url},
    }
    made = post(client, f"/api/sessions/{session.id}/monitors", body, auth).json()
    m = Monitor.objects.get(id=made["id"])
    feed.add(2)
    receiver.modes = ["drop"]
    Monitor.objects.filter(id=m.id).update(due_at=timezone.now() - timedelta(seconds=1))
    run.tick()
    e = Edition.objects.get(monitor=m)
    assert e.status == "unknown", e.reason
    assert receiver.posts == 1 and len(receiver.accepted) == 1
    return m, e


def test_unknown_send_is_an_unknown_effect_resolved_through_the_effects_door(
    session: Any, owner: Any, make_user: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, settings: Any
) -> None:
    """The receiver accepts and drops the connection: the edition is unknown and so is the send in the
    session's effect ledger (GET .../effects, /ops/ unknown effects), without parking the session. A staff
    member answers it at the effects door (POST .../effects/{call}/resolve, its one access rule: the owner
    may not unless TERRET_OWNER_MAY_RESOLVE); rerun sends it again under the same Idempotency-Key, and the
    receiver counts one delivery."""
    from sessions_app.models import Session
    from sessions_app.runtime.effects import effects_audit

    settings.TERRET_MONITOR_RESEND_SECONDS = 3600  # the host's own re-send waits: an operator answers first
    settings.TERRET_OWNER_MAY_RESOLVE = False
    client = Client()
    mine, ops = bearer(token_for(owner)), bearer(token_for(make_user("ops", is_staff=True)))
    m, e = unknown_webhook_edition(client, session, mine, feed_server, edition_receiver)
    call = f"edition-{e.id}"

    listed = client.get(f"/api/sessions/{session.id}/effects", **ops).json()  # type: ignore[arg-type]
    [effect] = listed["effects"]
    assert listed["pending"] == 1
    assert effect["call_id"] == call and effect["tool"] == "monitor.publish" and effect["state"] == "unknown"
    assert effect["idempotency_key"] == str(e.id) and effect["edition_id"] == str(e.id)
    assert effect["replay"] == "safe"
    s = Session.objects.get(id=session.id)
    # Among the unresolved effects on /ops/, and the session's own turns are not held by it.
    assert s.unresolved_effects == 1 and s.unknown_effects == 0 and s.status == "idle"
    attention = client.get("/api/ops/attention", **ops).json()  # type: ignore[arg-type]
    unknown = attention["attention"]["unknown_effects"]
    assert [i["session_id"] for i in unknown] == [str(session.id)]
    assert [c["call_id"] for c in unknown[0]["detail"]["calls"]] == [call]
    # Nothing else is sent meanwhile, not even by the host.
    run.tick()
    assert edition_receiver.posts == 1

    path = f"/api/sessions/{session.id}/effects/{call}/resolve"
    assert post(client, path, {"action": "rerun"}, mine).status_code == 403  # the access rule: staff only
    r = post(client, path, {"action": "rerun"}, ops)
    assert r.status_code == 200, r.content
    assert r.json()["resolved"]["edition_id"] == str(e.id) and r.json()["status"] == "idle"
    e.refresh_from_db()
    assert e.status == "prepared" and "asked by ops" in e.reason
    run.tick()  # the monitor's clock sends it again
    e.refresh_from_db()
    assert e.status == "confirmed" and e.receipt == f"rcpt-{e.id}" and e.attempts == 2
    assert edition_receiver.posts == 2
    assert len(edition_receiver.accepted) == 1  # the same key: one delivery at the receiver
    assert post(client, path, {"action": "failed"}, ops).status_code == 409  # settled: nothing pending
    s.refresh_from_db()
    assert s.unresolved_effects == 0
    audit = effects_audit(session.id)
    assert audit.ok, audit.problems
    assert audit.counts == {"resolved": 1, "done": 1, "calls": 1}


def test_the_edition_alias_resolves_through_the_same_service(
    session: Any, owner: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, settings: Any
) -> None:
    """POST /api/monitors/{id}/editions/{eid}/resolve is the effect resolution reached by the edition:
    done needs the destination's receipt, and it writes the same tool/resolved."""
    from sessions_app.models import Event
    from sessions_app.runtime.effects import effects_audit

    settings.TERRET_MONITOR_RESEND_SECONDS = 3600
    settings.TERRET_OWNER_MAY_RESOLVE = True
    client = Client()
    auth = bearer(token_for(owner))
    m, e = unknown_webhook_edition(client, session, auth, feed_server, edition_receiver)
    path = f"/api/monitors/{m.id}/editions/{e.id}/resolve"
    assert post(client, path, {"action": "done"}, auth).status_code == 400  # confirmation needs a receipt
    assert Edition.objects.get(id=e.id).status == "unknown"  # the refusal changed nothing
    r = post(client, path, {"action": "done", "receipt": f"rcpt-{e.id}"}, auth)
    assert r.status_code == 200 and r.json()["status"] == "confirmed" and r.json()["receipt"] == f"rcpt-{e.id}"
    assert DeliveryLedger.objects.filter(monitor=m).count() == 2
    [resolved] = Event.objects.filter(session_id=session.id, kind="tool/resolved").values_list("data", flat=True)
    assert resolved["call_id"] == f"edition-{e.id}" and resolved["action"] == "done"
    assert post(client, path, {"action": "failed"}, auth).status_code == 409
    assert edition_receiver.posts == 1  # done sends nothing
    assert effects_audit(session.id).ok


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
