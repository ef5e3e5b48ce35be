"""/metrics: a scrape parsed as Prometheus text, its figures checked against
the database; who may scrape it. Turns are driven in-process against the
fake model (TERRET_WORKER=manual), so the tallies are written by the log's
real append statements."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from sessions_app import log, services
from sessions_app.models import NOTIFY_STATUSES, Event, ModelTally, Notification, RuntimeCounter, Session, TurnTally
from sessions_app.runtime import lease
from sessions_app.runtime.drive import drive
from sessions_app.runtime.sweep import sweep_round
from sessions_app.services.budgets import set_budget
from sessions_app.tasks import drive_session
from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: Client, **headers: Any) -> Samples:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    out: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def staff_client(client: Client, make_user: Any) -> Client:
    client.force_login(make_user("ops", is_staff=True))
    return client


def test_sessions_by_status_live_turns_and_approvals(staff_client: Client, owner: Any, profile: Any) -> None:
    idle = services.create_session(owner, profile)
    running = services.create_session(owner, profile)
    services.run_turn(running.id, "go")
    held = lease.claim(running.id)
    assert held is not None
    lease.keeper.drop(held)  # live for TERRET_LEASE_SECONDS; no renewal thread left behind
    blocked = services.create_session(owner, profile)
    services.run_turn(blocked.id, "go")
    log.append(blocked.id, "turn/blocked", {"reason": "provider down", "attempts": 3})
    waiting = services.create_session(owner, profile)
    services.run_turn(waiting.id, "go")
    first = log.append(waiting.id, "approval/requested", {"call_id": "c1", "name": "debug.noop", "args": {}})
    time.sleep(0.5)
    log.append(waiting.id, "approval/requested", {"call_id": "c2", "name": "debug.noop", "args": {}})
    log.append(waiting.id, "approval/resolved", {"call_id": "c1", "verdict": "approve"})
    time.sleep(0.01)

    samples = scrape(staff_client)
    since_first = (timezone.now() - Event.objects.get(session=waiting, seq=first.seq).created_at).total_seconds()

    statuses = Counter(s.status for s in Session.objects.all())
    assert statuses["idle"] >= 1 and statuses["running"] == 1
    assert statuses["blocked"] == 1 and statuses["waiting_approval"] == 1
    for status in ("idle", "running", "waiting_approval", "waiting_reconcile", "blocked", "suspended", "revoked"):
        assert value(samples, "terret_sessions", status=status) == statuses[status], status
    assert {Session.objects.get(pk=s.pk).status for s in (idle, running, blocked, waiting)} == {
        "idle", "running", "blocked", "waiting_approval",
    }  # fmt: skip
    assert value(samples, "terret_turns_live") == 1  # only `running` holds a lease
    assert value(samples, "terret_turns_blocked") == 1
    assert value(samples, "terret_approvals_pending") == 1  # c2; c1 was answered
    age = value(samples, "terret_approval_oldest_age_seconds")
    assert 0 < age < since_first - 0.4  # c2's age: c1, half a second older, was answered
    assert value(samples, "terret_sweeps_total") == 0


def test_an_expired_request_is_no_longer_the_oldest_waiting(staff_client: Client, owner: Any, profile: Any) -> None:
    waiting = services.create_session(owner, profile)
    services.run_turn(waiting.id, "go")
    first = log.append(waiting.id, "approval/requested", {"call_id": "c1", "name": "debug.noop", "args": {}})
    time.sleep(0.5)
    log.append(waiting.id, "approval/requested", {"call_id": "c2", "name": "debug.noop", "args": {}})
    expiry = {"call_id": "c1", "request_seq": first.seq, "deadline_s": 5, "on_expiry": "deny"}
    log.append(waiting.id, "approval/expired", expiry)
    samples = scrape(staff_client)
    since_first = (timezone.now() - Event.objects.get(session=waiting, seq=first.seq).created_at).total_seconds()
    assert value(samples, "terret_approvals_pending") == 1  # c2; c1's expiry denied it
    assert 0 < value(samples, "terret_approval_oldest_age_seconds") < since_first - 0.4


def test_turns_ended_and_model_requests(staff_client: Client, fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one", usage=(10, 2, 0.001)), Reply(text="two", usage=(5, 1, 0.002)))
    for text in ("a", "b"):
        services.run_turn(session.id, text)
        assert drive(session.id) == "ended"
    set_budget(session.id, {"cost_usd": None, "tokens": None, "steps": None, "turns": 0}, by="t")
    services.run_turn(session.id, "c")
    drive(session.id)
    assert [e.data for e in session.events.filter(kind="turn/end").order_by("seq")][-1]["status"] == "rejected"

    samples = scrape(staff_client)

    assert value(samples, "terret_turns_ended_total", status="completed", reason="") == 2
    assert value(samples, "terret_turns_ended_total", status="rejected", reason="turns") == 1
    tallied = {(t.status, t.reason): t.count for t in TurnTally.objects.all()}
    assert tallied == {("completed", ""): 2, ("rejected", "turns"): 1}
    assert value(samples, "terret_model_requests_total", model="test/model", profile="t") == 2
    assert ModelTally.objects.get().requests == session.events.filter(kind="step/start").count() == 2
    assert value(samples, "terret_tokens_total", profile="t", kind="prompt") == 15
    assert value(samples, "terret_tokens_total", profile="t", kind="completion") == 3
    assert value(samples, "terret_cost_usd_total", profile="t") == pytest.approx(0.003)
    assert value(samples, "terret_steps_total", profile="t") == 2
    assert value(samples, "terret_turns_started_total", profile="t") == 3
    # By model: what each step/end says its model spent, and how long its request took.
    ends = [e.data for e in session.events.filter(kind="step/end").order_by("seq")]
    assert [e["model"] for e in ends] == ["test/model", "test/model"]
    assert value(samples, "terret_model_tokens_total", model="test/model", profile="t", kind="prompt") == 15
    assert value(samples, "terret_model_tokens_total", model="test/model", profile="t", kind="completion") == 3
    assert value(samples, "terret_model_cost_usd_total", model="test/model", profile="t") == pytest.approx(0.003)
    assert value(samples, "terret_model_timed_requests_total", model="test/model") == 2
    assert value(samples, "terret_model_latency_seconds_total", model="test/model") == pytest.approx(
        sum(e["latency_ms"] for e in ends) / 1000
    )


def test_sweep_rounds_are_counted_in_the_database(staff_client: Client) -> None:
    sweep_round(at_start=False, wake=lambda sid: None)
    sweep_round(at_start=False, wake=lambda sid: None)
    assert RuntimeCounter.objects.get(name="sweeps").value == 2
    assert value(scrape(staff_client), "terret_sweeps_total") == 2


def test_takeovers_and_queue_wait_are_counted_by_the_workers_and_flushed(
    staff_client: Client, fake_llm: Any, session: Session
) -> None:
    """A drive that re-enters a turn mid-step counts a takeover; a drive
    task counts its queue wait; the sweep round writes both."""
    services.run_turn(session.id, "go")
    log.append(session.id, "step/start", {"step": 1, "model": "test/model"})  # what a dead worker left
    fake_llm.script(Reply(text="taken over"))
    assert drive_session(str(session.id), time.time() - 0.25) == "ended"
    sweep_round(at_start=False, wake=lambda sid: None)
    samples = scrape(staff_client)
    assert value(samples, "terret_lease_takeovers_total") == 1
    assert value(samples, "terret_queue_waits_total") == 1
    assert value(samples, "terret_queue_wait_seconds_total") >= 0.25


def test_notification_outbox_rows_by_state(staff_client: Client, session: Session, owner: Any) -> None:
    """Every state is reported (0 included), so an alert on failed or unknown rows has a series to watch."""
    for seq, status in enumerate(("pending", "pending", "sent", "failed", "unknown"), start=1):
        Notification.objects.create(
            session=session, seq=seq, kind="turn/blocked", name="x", recipient=owner, channel="email", status=status
        )
    samples = scrape(staff_client)
    got = {status: value(samples, "terret_notifications", status=status) for status in NOTIFY_STATUSES}
    assert got == {"pending": 2, "claimed": 0, "sending": 0, "sent": 1, "unknown": 1, "failed": 1, "dropped": 0}


def test_access(client: Client, make_user: Any, settings: Any) -> None:
    settings.TERRET_METRICS_TOKEN = ""
    response = client.get("/metrics")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything").status_code == 403  # token access off

    settings.TERRET_METRICS_TOKEN = "s3cret-token"
    scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic s3cret-token").status_code == 401

    client.force_login(make_user("plain"))
    assert client.get("/metrics").status_code == 403
    client.force_login(make_user("ops", is_staff=True))
    scrape(client)
    assert client.post("/metrics").status_code == 405
