"""The outbox: notification rows made from a committed event, and their
life as a sender claims, sends and closes them.

Every step is one conditional UPDATE on the row (a claim, like healthchecks'
sendalerts), so two senders never hold one row, and a sender whose claim was
taken over (its lease ran out) changes nothing with its stale token. The
states and what a crash in each leaves are in docs/notifications.md.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from sessions_app.log import AppendedEvent
from sessions_app.models import Event, Notification, PersonNotifications, ProfileNotifications, Session
from sessions_app.notify.rules import RULES

MAX_ERROR_CHARS = 2000
MAX_SUMMARY_CHARS = 300


def _one_line(text: str) -> str:
    """A summary fit for an email's subject: one line (a title or a reason may hold newlines), bounded."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_SUMMARY_CHARS else line[: MAX_SUMMARY_CHARS - 1] + "…"


def person_settings(user: Any) -> PersonNotifications:
    """The person's settings, or the defaults (not saved) when they have none."""
    found = PersonNotifications.objects.filter(user=user).first()
    return found or PersonNotifications(user=user)


def profile_settings(profile_id: int | None) -> ProfileNotifications:
    found = ProfileNotifications.objects.filter(profile_id=profile_id).first() if profile_id else None
    return found or ProfileNotifications()


def channels(user: Any, person: PersonNotifications, profile: ProfileNotifications) -> list[str]:
    """The channels that reach this person for a session of this profile now."""
    out = []
    if settings.TERRET_EMAIL_ON and person.email and user.email and profile.email:
        out.append("email")
    if person.webhook_url and person.webhook_secret and profile.webhook:
        out.append("webhook")
    return out


def _any_channel() -> bool:
    """Whether anyone can be told at all (no email server, no webhook: one query, not a row per reviewer)."""
    return bool(settings.TERRET_EMAIL_ON) or PersonNotifications.objects.exclude(webhook_url="").exists()


def enqueue(event: AppendedEvent) -> list[int]:
    """The rows for a committed event, made once: a second call (the event
    seen again) adds nothing, by the unique (event, recipient, channel).
    Returns the ids still pending."""
    rule = RULES.get(event.kind)
    if rule is None or not rule.applies(event.data) or not _any_channel():
        return []
    session = Session.objects.filter(pk=event.session_id).only("id", "owner_id", "profile_id", "title").first()
    if session is None:
        return []
    profile = profile_settings(session.profile_id)
    summary = _one_line(rule.summary(event.data) + (f" in “{session.title}”" if session.title else ""))
    rows = []
    for user in rule.recipients(session, event).distinct():
        for channel in channels(user, person_settings(user), profile):
            rows.append(
                Notification(
                    session_id=session.id,
                    seq=event.seq,
                    kind=event.kind,
                    name=rule.name,
                    recipient=user,
                    channel=channel,
                    summary=summary,
                )
            )
    if not rows:
        return []
    Notification.objects.bulk_create(rows, ignore_conflicts=True)
    pending = Notification.objects.filter(session_id=session.id, seq=event.seq, status="pending")
    return list(pending.values_list("id", flat=True))


def _lease() -> timedelta:
    return timedelta(seconds=settings.TERRET_NOTIFY_LEASE_SECONDS)


def backoff(attempts: int) -> float:
    """Seconds before attempt `attempts + 1`: doubling from the base, capped."""
    base = settings.TERRET_NOTIFY_BACKOFF_SECONDS
    return float(min(base * 2 ** max(0, attempts - 1), settings.TERRET_NOTIFY_BACKOFF_CAP_SECONDS))


def claim(nid: int) -> Notification | None:
    """Take a due row (pending, or claimed by a sender whose lease ran out
    before it started sending); None if it is not due or someone has it."""
    token, now = uuid.uuid4().hex, timezone.now()
    taken = Notification.objects.filter(pk=nid, status__in=("pending", "claimed"), due_at__lte=now).update(
        status="claimed", claim=token, due_at=now + _lease(), attempts=F("attempts") + 1
    )
    if not taken:
        return None
    return Notification.objects.select_related("recipient", "session").filter(pk=nid, claim=token).first()


def start(n: Notification) -> bool:
    """The send is about to begin: from here a crash leaves the row unknown
    (not resent). False: the claim was lost."""
    mine = Notification.objects.filter(pk=n.pk, claim=n.claim, status="claimed")
    return bool(mine.update(status="sending", due_at=timezone.now() + _lease()))


def sent(n: Notification) -> bool:
    mine = Notification.objects.filter(pk=n.pk, claim=n.claim, status__in=("sending", "unknown"))
    return bool(mine.update(status="sent", sent_at=timezone.now(), due_at=None, last_error=""))


def failed(n: Notification, error: str) -> str:
    """A send that failed where the sender saw it: retried after the backoff,
    or failed for good once the attempts ran out. Returns the new status."""
    give_up = n.attempts >= settings.TERRET_NOTIFY_MAX_ATTEMPTS
    status = "failed" if give_up else "pending"
    due = None if give_up else timezone.now() + timedelta(seconds=backoff(n.attempts))
    mine = Notification.objects.filter(pk=n.pk, claim=n.claim, status__in=("claimed", "sending"))
    mine.update(status=status, due_at=due, last_error=error[:MAX_ERROR_CHARS])
    return status


def drop(n: Notification, why: str) -> None:
    mine = Notification.objects.filter(pk=n.pk, claim=n.claim, status="claimed")
    mine.update(status="dropped", due_at=None, last_error=why[:MAX_ERROR_CHARS])


def expire_sending() -> int:
    """Rows whose sender stopped during the send (its lease ran out): the
    receiver may have the message, so they are not resent but left unknown."""
    return Notification.objects.filter(status="sending", due_at__lte=timezone.now()).update(
        status="unknown", due_at=None, last_error="the sender stopped during the send; it may have arrived"
    )


def due_ids(limit: int = 100) -> list[int]:
    due = Notification.objects.filter(status__in=("pending", "claimed"), due_at__lte=timezone.now())
    return list(due.order_by("due_at").values_list("id", flat=True)[:limit])


def requeue(ids: list[int]) -> int:
    """An operator's "send again" for unknown or failed rows (the admin)."""
    again = Notification.objects.filter(pk__in=ids, status__in=("unknown", "failed"))
    return again.update(status="pending", due_at=timezone.now(), attempts=0)


class Backfill:
    """Rows for events whose listener never ran (the appending process died
    between the event's commit and its listener): each sender thread walks
    the events table by primary key and enqueues the kinds of RULES, which
    adds nothing where the listener did its work (the unique key).

    It looks only at events older than GRACE (the listener has had its
    chance, and an append whose id was taken earlier has committed by then),
    reads at most BATCH rows a round, and starts LOOKBACK_EVENTS back from the
    newest event, skipping events older than LOOKBACK (what a process that
    died just before this one started may have left).
    """

    GRACE = timedelta(seconds=10)
    LOOKBACK = timedelta(hours=1)
    LOOKBACK_EVENTS = 10_000
    BATCH = 2000

    def __init__(self) -> None:
        self.cursor: int | None = None

    def run(self) -> int:
        """One round; how many events of the table's kinds it enqueued."""
        now = timezone.now()
        newest = Event.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        if self.cursor is None or self.cursor > newest:  # first round, or a table emptied (tests)
            self.cursor = max(0, newest - self.LOOKBACK_EVENTS)
        rows = Event.objects.filter(pk__gt=self.cursor).order_by("pk").values_list("pk", "kind", "created_at")
        wanted: list[int] = []
        for pk, kind, created_at in rows[: self.BATCH]:
            if created_at > now - self.GRACE:
                break
            self.cursor = pk
            if kind in RULES and created_at >= now - self.LOOKBACK:
                wanted.append(pk)
        for event in Event.objects.filter(pk__in=wanted).order_by("pk"):
            enqueue(AppendedEvent(event.session_id, event.seq, event.kind, event.data, event.created_at))
        return len(wanted)
