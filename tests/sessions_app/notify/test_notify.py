"""Notifications from the log to a real SMTP server and a real HTTP receiver,
in this process (the sender's worker path is test_worker_notify.py).
Runs on SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from sessions_app import log
from sessions_app.models import Notification, PersonNotifications, ProfileNotifications, Session
from sessions_app.notify import delivery, outbox
from tests.approvals_app.conftest import park
from tests.helpers import wait_for
from tests.sessions_app.apiutil import bearer, token_for
from tests.sessions_app.notify.conftest import SECRET, Mailbox, Receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people(make_user: Any, make_reviewer: Any, receiver: Receiver) -> dict[str, Any]:
    """A staff member and a reviewers-group member (both told of approvals, by
    email; the reviewer by webhook too), and a plain user who is not."""
    staff = make_user("boss", email="boss@example.com", is_staff=True)
    rev = make_reviewer("rev", email="rev@example.com")
    PersonNotifications.objects.create(user=rev, webhook_url=receiver.url, webhook_secret=SECRET)
    bystander = make_user("bystander", email="by@example.com")
    return {"staff": staff, "rev": rev, "bystander": bystander}


def parked(session: Session) -> log.AppendedEvent:
    seq = park(session.id, name="workspace.write")
    row = session.events.get(seq=seq)
    return log.AppendedEvent(session.id, seq, row.kind, row.data, row.created_at)


def rows(session: Session) -> list[tuple[str, str, str]]:
    found = Notification.objects.filter(session=session).order_by("recipient__username", "channel")
    return [(n.recipient.username, n.channel, n.status) for n in found]


@pytest.mark.usefixtures("manual_worker")
def test_a_new_approval_sends_one_email_per_reviewer_and_one_signed_webhook(
    session: Session, people: dict[str, Any], mailbox: Mailbox, receiver: Receiver
) -> None:
    seq = park(session.id)  # the listener makes the rows after commit
    assert rows(session) == [("boss", "email", "pending"), ("rev", "email", "pending"), ("rev", "webhook", "pending")]

    assert delivery.sweep_once() == 3
    assert rows(session) == [("boss", "email", "sent"), ("rev", "email", "sent"), ("rev", "webhook", "sent")]
    [to_boss], [to_rev] = mailbox.to("boss@example.com"), mailbox.to("rev@example.com")
    assert len(mailbox.messages) == 2 and mailbox.to("by@example.com") == []
    assert "approval needed for workspace.write" in to_rev["Subject"]
    assert f"/sessions/{session.id}/" in to_rev.get_payload()
    assert to_boss["Message-ID"].startswith("<terret-notification-")
    [hook] = receiver.deliveries
    assert hook.signed_with(SECRET) and not hook.signed_with("another-secret-entirely")
    assert hook.json() == {
        "event": "approval_requested",
        "session_id": str(session.id),
        "seq": seq,
        "kind": "approval/requested",
        "summary": "approval needed for workspace.write",
        "url": f"http://127.0.0.1:8000/sessions/{session.id}/",
    }
    webhook_row = Notification.objects.get(session=session, channel="webhook")
    assert hook.headers["x-terret-delivery"] == str(webhook_row.pk)

    assert delivery.sweep_once() == 0  # nothing is sent twice
    assert len(mailbox.messages) == 2 and len(receiver.deliveries) == 1


@pytest.mark.usefixtures("manual_worker")
def test_the_same_event_seen_twice_makes_no_second_row(
    session: Session, people: dict[str, Any], mailbox: Mailbox
) -> None:
    event = parked(session)
    made = sorted(Notification.objects.filter(session=session).values_list("pk", flat=True))
    assert len(made) == 3  # by the listener
    assert sorted(outbox.enqueue(event)) == made  # the same rows, still pending: none new
    assert Notification.objects.filter(session=session).count() == 3
    delivery.sweep_once()
    assert outbox.enqueue(event) == [] and Notification.objects.filter(session=session).count() == 3
    assert len(mailbox.messages) == 2


@pytest.mark.usefixtures("manual_worker")
def test_a_failed_webhook_is_retried_with_backoff_then_given_up(
    session: Session, people: dict[str, Any], mailbox: Mailbox, receiver: Receiver, settings: Any
) -> None:
    settings.TERRET_NOTIFY_BACKOFF_SECONDS = 0
    settings.TERRET_NOTIFY_MAX_ATTEMPTS = 3
    receiver.statuses = [500, 503]
    park(session.id)
    hook = Notification.objects.get(session=session, channel="webhook")
    assert delivery.deliver(hook.pk) == "pending"
    assert delivery.deliver(hook.pk) == "pending"
    assert delivery.deliver(hook.pk) == "sent"
    hook.refresh_from_db()
    assert (hook.status, hook.attempts, len(receiver.deliveries)) == ("sent", 3, 3)

    settings.TERRET_NOTIFY_BACKOFF_SECONDS = 60
    receiver.statuses = [500] * 5
    seq = park(session.id, call_id="c2", new_turn=False)
    second = Notification.objects.get(session=session, seq=seq, channel="webhook")
    assert delivery.deliver(second.pk) == "pending"
    second.refresh_from_db()
    assert 55 < (second.due_at - second.created_at).total_seconds() < 70  # backed off, not due yet
    assert delivery.deliver(second.pk) == "busy"
    assert "answered 500" in second.last_error


def test_backoff_doubles_to_its_cap(settings: Any) -> None:
    settings.TERRET_NOTIFY_BACKOFF_SECONDS = 5
    settings.TERRET_NOTIFY_BACKOFF_CAP_SECONDS = 30
    assert [outbox.backoff(a) for a in (1, 2, 3, 4, 5)] == [5, 10, 20, 30, 30]


@pytest.mark.usefixtures("manual_worker")
def test_channels_follow_the_person_and_the_profile(
    session: Session, people: dict[str, Any], mailbox: Mailbox, receiver: Receiver
) -> None:
    ProfileNotifications.objects.create(profile=session.profile, email=False, webhook=True)
    PersonNotifications.objects.create(user=people["staff"], email=False)
    park(session.id)
    assert rows(session) == [("rev", "webhook", "pending")]

    # Turned off after the row was made: dropped at send time, nothing sent.
    ProfileNotifications.objects.filter(profile=session.profile).update(webhook=False)
    delivery.sweep_once()
    assert rows(session) == [("rev", "webhook", "dropped")] and receiver.deliveries == []


@pytest.mark.usefixtures("manual_worker")
def test_no_email_rows_when_the_server_sends_no_email(
    session: Session, people: dict[str, Any], receiver: Receiver, settings: Any
) -> None:
    settings.TERRET_EMAIL_ON = False
    park(session.id)
    assert rows(session) == [("rev", "webhook", "pending")]


@pytest.mark.usefixtures("manual_worker")
def test_what_needs_the_owner_and_operators(
    session: Session, people: dict[str, Any], mailbox: Mailbox, make_user: Any
) -> None:
    """A blocked turn, an unknown effect and a budget hold reach the owner and
    staff, not the reviewers group; an operator's suspension hold reaches nobody."""
    Session.objects.filter(pk=session.pk).update(owner=make_user("own", email="own@example.com"))
    with log.locked(session.id) as tx:
        tx.append("turn/start", {})
        tx.append("turn/blocked", {"reason": "the model\nis down", "attempts": 3, "code": "retries_exhausted"})
    budget = {"budget": "cost_usd", "scope": "session", "limit": 1, "spent": 1}
    log.append(session.id, "input/held", {"source_seq": 1, "reason": budget})
    log.append(session.id, "input/held", {"source_seq": 1, "reason": {"hold": "suspended", "scope": "global"}})
    found = Notification.objects.filter(session=session).order_by("seq", "recipient__username")
    assert [(n.name, n.recipient.username) for n in found] == [
        ("turn_blocked", "boss"),
        ("turn_blocked", "own"),
        ("budget_exhausted", "boss"),
        ("budget_exhausted", "own"),
    ]
    delivery.sweep_once()
    [held] = [m for m in mailbox.to("own@example.com") if "budget" in m["Subject"]]
    assert "budget exhausted: cost_usd (session)" in held["Subject"]
    [blocked] = [m for m in mailbox.to("own@example.com") if "blocked" in m["Subject"]]
    assert blocked["Subject"] == "[Terret] turn blocked: the model is down"  # one line, whatever the reason holds


@pytest.mark.usefixtures("manual_worker")
def test_a_send_interrupted_by_a_crash_is_left_unknown_and_not_resent(
    session: Session, people: dict[str, Any], mailbox: Mailbox, settings: Any
) -> None:
    """The states a killed sender leaves, without the kill (the worker test kills)."""
    park(session.id)
    claimed, started, _ = Notification.objects.filter(session=session).order_by("pk")
    first = outbox.claim(claimed.pk)  # a sender claims and dies before sending
    second = outbox.claim(started.pk)
    assert first and second and outbox.start(second)  # another dies during its send
    Notification.objects.filter(pk__in=[claimed.pk, started.pk]).update(
        due_at=timezone.now() - timedelta(seconds=1)
    )  # leases run out
    delivery.sweep_once()
    claimed.refresh_from_db(), started.refresh_from_db()
    assert (claimed.status, claimed.attempts) == ("sent", 2)  # re-claimed and sent
    assert started.status == "unknown" and "may have arrived" in started.last_error
    assert not outbox.sent(first)  # the dead sender's stale claim changes nothing
    assert outbox.requeue([started.pk]) == 1  # an operator's "send again"
    delivery.sweep_once()
    started.refresh_from_db()
    assert started.status == "sent"


@pytest.mark.usefixtures("manual_worker")
def test_an_event_whose_listener_never_ran_is_told_by_the_backfill(
    session: Session, people: dict[str, Any], mailbox: Mailbox, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The appending process died between the commit and its listener: the
    sender thread's walk of the events table makes the rows, once."""
    with monkeypatch.context() as crash:
        crash.setattr(outbox, "enqueue", lambda event: [])
        park(session.id)
    assert rows(session) == []
    monkeypatch.setattr(outbox.Backfill, "GRACE", timedelta(0))
    monkeypatch.setattr(delivery, "_backfill", outbox.Backfill())
    delivery.sweep_once()
    assert rows(session) == [("boss", "email", "sent"), ("rev", "email", "sent"), ("rev", "webhook", "sent")]
    delivery.sweep_once()
    assert len(mailbox.messages) == 2 and len(receiver.deliveries) == 1
    monkeypatch.setattr(delivery, "_backfill", outbox.Backfill())  # a fresh process walks the same events
    delivery.sweep_once()
    assert len(mailbox.messages) == 2 and len(receiver.deliveries) == 1


# ---------------------------------------------------------------- the person's settings


def test_settings_api_masks_the_secret_and_refuses_bad_input(client: Any, owner: Any, settings: Any) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["127.0.0.1"]
    auth = bearer(token_for(owner))
    got = client.get("/api/me/notifications", **auth)
    assert got.status_code == 200 and got.json() == {"email": True, "webhook_url": None, "webhook_secret": None}

    put = client.put(
        "/api/me/notifications",
        {"webhook_url": "http://127.0.0.1:9/hook", "webhook_secret": SECRET},
        content_type="application/json",
        **auth,
    )
    assert put.status_code == 200, put.content
    masked = put.json()["webhook_secret"]
    assert SECRET not in put.content.decode() and masked.endswith(SECRET[-4:])
    # Writing the masked value back (read, change, write) keeps the secret.
    again = {**put.json(), "email": False}
    assert client.put("/api/me/notifications", again, content_type="application/json", **auth).status_code == 200
    row = PersonNotifications.objects.get(user=owner)
    assert (row.email, row.webhook_secret) == (False, SECRET)

    for body, code in [
        ({"webhook_url": "http://169.254.169.254/latest/"}, "unsafe_url"),
        ({"webhook_url": "http://10.0.0.1/x"}, "unsafe_url"),
        ({"webhook_url": "ftp://example.com/"}, "unsafe_url"),
        ({"webhook_secret": "short"}, "invalid_input"),
        ({"email": "yes"}, None),
    ]:
        bad = client.put("/api/me/notifications", body, content_type="application/json", **auth)
        assert bad.status_code in (400, 422), (body, bad.content)
        if code:
            assert bad.json()["code"] == code, bad.json()
    row.refresh_from_db()
    assert (row.email, row.webhook_url, row.webhook_secret) == (False, "http://127.0.0.1:9/hook", SECRET)

    removed = client.put("/api/me/notifications", {"webhook_url": None}, content_type="application/json", **auth)
    assert removed.json() == {"email": False, "webhook_url": None, "webhook_secret": None}
    assert PersonNotifications.objects.get(user=owner).webhook_secret == ""


def test_a_webhook_needs_a_secret(client: Any, owner: Any, settings: Any) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["127.0.0.1"]
    bad = client.put(
        "/api/me/notifications",
        {"webhook_url": "http://127.0.0.1:9/hook"},
        content_type="application/json",
        **bearer(token_for(owner)),
    )
    assert bad.status_code == 400 and "needs a secret" in bad.json()["message"]
    assert not PersonNotifications.objects.filter(user=owner).exists()


def test_settings_page_saves_and_never_shows_the_secret(client: Any, owner: Any, settings: Any) -> None:
    settings.TERRET_ALLOW_PRIVATE_HOSTS = ["127.0.0.1"]
    client.force_login(owner)
    saved = client.post(
        "/settings/notifications/", {"webhook_url": "http://127.0.0.1:9/hook", "webhook_secret": SECRET}
    )
    assert saved.status_code == 302
    page = client.get("/settings/").content.decode()
    assert SECRET not in page and SECRET[-4:] in page and "http://127.0.0.1:9/hook" in page
    refused = client.post("/settings/notifications/", {"webhook_url": "http://192.168.1.1/"})
    assert refused.status_code == 400 and "private, loopback or link-local" in refused.content.decode()
    row = PersonNotifications.objects.get(user=owner)
    assert (row.email, row.webhook_url) == (False, "http://127.0.0.1:9/hook")  # the refused form changed nothing


# ---------------------------------------------------------------- the admin


@pytest.mark.usefixtures("manual_worker")
def test_admin_shows_the_outbox_and_sends_an_unknown_row_again(
    client: Any, session: Session, people: dict[str, Any], mailbox: Mailbox, django_user_model: Any
) -> None:
    park(session.id)
    row = Notification.objects.filter(session=session, channel="email").first()
    assert row is not None
    Notification.objects.filter(pk=row.pk).update(status="unknown", due_at=None)
    client.force_login(django_user_model.objects.create_superuser("root", "", "root-pass-123"))
    assert client.get("/admin/sessions_app/notification/").status_code == 200
    assert client.get(f"/admin/sessions_app/notification/{row.pk}/change/").status_code == 200
    profile_page = f"/admin/sessions_app/agentprofile/{session.profile_id}/change/"
    assert "notification channels" in client.get(profile_page).content.decode()
    assert ProfileNotifications.objects.count() == 0
    page = client.get(profile_page)
    data = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None}
    data.update({k: json.dumps(v) for k, v in data.items() if isinstance(v, list | dict) and k != "builtin_tools"})
    data.update({"created_at_0": "2026-01-01", "created_at_1": "00:00:00"})
    [inline] = page.context["inline_admin_formsets"]
    management = inline.formset.management_form
    data.update({management.add_prefix(k): v for k, v in management.initial.items()})
    data.update({"notify_settings-0-webhook": "on", "notify_settings-0-profile": str(session.profile_id)})
    assert client.post(profile_page, data).status_code == 302  # email left unticked: off
    assert ProfileNotifications.objects.filter(profile=session.profile).values_list("email", "webhook").get() == (
        False,
        True,
    )
    page = client.get(f"/admin/sessions_app/personnotifications/{people['rev'].pk}/change/").content.decode()
    assert SECRET not in page and SECRET[-4:] in page
    client.post(
        "/admin/sessions_app/notification/", {"action": "send_again", "_selected_action": [row.pk]}, follow=True
    )
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("pending", 0)


def test_embedded_mode_sends_on_this_process_pool(
    session: Session, people: dict[str, Any], mailbox: Mailbox, receiver: Receiver, settings: Any
) -> None:
    """Without Celery the listener's wake-up sends on this process's own pool, at once."""
    settings.TERRET_WORKER = "inprocess"
    park(session.id, new_turn=True)
    wait_for(lambda: [s for *_, s in rows(session)] == ["sent"] * 3, 20, "the pool to send all three")
    assert len(mailbox.messages) == 2 and len(receiver.deliveries) == 1
