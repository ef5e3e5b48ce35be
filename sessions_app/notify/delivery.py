"""Sending the outbox: email through Django's default mailer (SMTP, its
settings from the environment: terret_site/settings.py), and signed webhooks.

`deliver(id)` claims one row, prepares the message from the person's
settings as they are now, marks the send as started, sends, and marks it
sent; a failure it sees is retried with backoff (outbox.failed). Where a
crash (kill -9) at each of these points leaves a row, and so what is
guaranteed, is in docs/notifications.md; the failpoints `notify_claimed`
and `notify_sent` (per channel, TERRET_FAILPOINTS) let a test kill a worker
exactly there.

Rows reach a sender two ways: a wake-up with their ids right after they are
made (a Celery task by name, or this process's small pool in embedded mode),
and each worker's sender thread, which every TERRET_NOTIFY_POLL_SECONDS
takes what is due (retries, lost wake-ups, a dead sender's claims), leaves
a dead sender's interrupted sends unknown, and makes the rows of events
whose listener never ran (outbox.Backfill).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from celery import current_app
from django.conf import settings
from django.core import mail
from django.core.mail import EmailMessage
from django.db import connection

from sessions_app import outbound
from sessions_app.models import Notification
from sessions_app.notify import outbox
from sessions_app.runtime import failpoints, lifecycle

log = logging.getLogger(__name__)

NOTIFY_TASK = "terret.notify"
SIGNATURE_HEADER = "X-Terret-Signature"
DELIVERY_HEADER = "X-Terret-Delivery"


class Dropped(Exception):
    """The channel is off for this person or profile now: nothing to send."""


def session_url(n: Notification) -> str:
    return f"{settings.TERRET_PUBLIC_URL}/sessions/{n.session_id}/"


def webhook_body(n: Notification) -> bytes:
    body = {
        "event": n.name,
        "session_id": str(n.session_id),
        "seq": n.seq,
        "kind": n.kind,
        "summary": n.summary,
        "url": session_url(n),
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: str, body: bytes) -> str:
    """The X-Terret-Signature value: HMAC-SHA256 of the raw body, keyed with the secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _prepare(n: Notification) -> Callable[[], None]:
    """The send, built from the settings as they are now (Dropped if the
    channel is off meanwhile)."""
    user = n.recipient
    person = outbox.person_settings(user)
    profile = outbox.profile_settings(n.session.profile_id)
    if not user.is_active or n.channel not in outbox.channels(user, person, profile):
        raise Dropped(f"{n.channel} is off for this person or profile now")
    if n.channel == "email":
        return _email(n, user.email)
    return _webhook(n, person.webhook_url, person.webhook_secret)


def _email(n: Notification, address: str) -> Callable[[], None]:
    domain = settings.DEFAULT_FROM_EMAIL.rpartition("@")[2] or "terret"
    message = EmailMessage(
        subject=f"[Terret] {n.summary}"[:200],
        body=f"{n.summary}\n\n{session_url(n)}\n",
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[address],
        # One id per outbox row: a receiving side that dedupes by Message-ID sees a resend as one.
        headers={"Message-ID": f"<terret-notification-{n.pk}@{domain}>"},
    )

    def send() -> None:
        if mail.mailers.default.send_messages([message]) != 1:
            raise RuntimeError("the mailer sent nothing")

    return send


def _webhook(n: Notification, url: str, secret: str) -> Callable[[], None]:
    body = webhook_body(n)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Terret-Notifications",
        SIGNATURE_HEADER: signature(secret, body),
        DELIVERY_HEADER: str(n.pk),
    }

    def send() -> None:
        response = outbound.request(
            "POST", url, content=body, headers=headers, timeout=settings.TERRET_NOTIFY_TIMEOUT_SECONDS
        )
        if not 200 <= response.status_code < 300:
            raise RuntimeError(f"the webhook answered {response.status_code}")

    return send


def deliver(nid: int) -> str:
    """Claim, send and close one row; the row's status afterwards, or
    "busy" when it was not due or another sender has it."""
    n = outbox.claim(nid)
    if n is None:
        return "busy"
    failpoints.pause("notify_claimed", n.channel)
    try:
        send = _prepare(n)
    except Dropped as exc:
        outbox.drop(n, str(exc))
        return "dropped"
    if not outbox.start(n):
        return "busy"
    try:
        send()
    except Exception as exc:  # the network, the receiver, the URL check: the sender saw it fail
        log.warning("notification %s by %s not sent: %s", n.pk, n.channel, type(exc).__name__)
        return outbox.failed(n, f"{type(exc).__name__}: {exc}")
    failpoints.pause("notify_sent", n.channel)
    outbox.sent(n)
    return "sent"


def deliver_many(ids: list[int]) -> dict[int, str]:
    try:
        return {nid: deliver(nid) for nid in ids}
    finally:
        connection.close()  # a pool thread or a task: no connection kept between runs


_backfill = outbox.Backfill()


def sweep_once() -> int:
    """One round of the sender thread: interrupted sends left unknown, rows
    made for events whose listener never ran, then everything due sent.
    Returns how many rows were due."""
    outbox.expire_sending()
    _backfill.run()
    ids = outbox.due_ids()
    for nid in ids:
        deliver(nid)
    return len(ids)


# -- wake-ups -----------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def wake(ids: list[int]) -> None:
    """Have the new rows sent now; never raises (the sender thread is the
    fallback for a wake-up that is lost)."""
    if not ids or settings.TERRET_WORKER == "manual":
        return
    try:
        for nid in ids:  # one by one, so a slow receiver holds up no other
            if settings.TERRET_WORKER == "celery":
                current_app.send_task(NOTIFY_TASK, args=[[nid]])
            else:
                _get_pool().submit(deliver_many, [nid])
    except Exception as exc:
        log.warning("notification wake-up for %s not sent (%s); the sender thread will find them", ids, exc)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="terret-notify")
        return _pool


# -- the sender thread --------------------------------------------------------

_sender: threading.Thread | None = None
_sender_lock = threading.Lock()
_stopping = threading.Event()


def start_sender(active: Callable[[], bool] = lambda: True) -> None:
    """Start this process's sender thread (once); `active` is asked before
    every round, and a draining worker sends nothing more."""
    global _sender
    with _sender_lock:
        if _sender is not None and _sender.is_alive():
            return
        _stopping.clear()
        _sender = threading.Thread(target=_run, args=(active,), name="terret-notify", daemon=True)
        _sender.start()


def stop_sender() -> None:
    global _sender
    with _sender_lock:
        thread, _sender = _sender, None
    _stopping.set()
    if thread is not None:
        thread.join(timeout=10)


def _run(active: Callable[[], bool]) -> None:
    while not _stopping.is_set():
        if active() and not lifecycle.draining.is_set():
            try:
                sweep_once()
            except Exception:
                log.exception("notification sender round failed")
            finally:
                connection.close()
        _stopping.wait(settings.TERRET_NOTIFY_POLL_SECONDS)
