"""Notifications: who wants them how, and the durable outbox of what to send.

Settings: a person's (`PersonNotifications`: email on or off, a webhook URL
and its secret), and a profile's (`ProfileNotifications`: which channels its
sessions' notifications may use). No row means the default: email on, no
webhook for a person; both channels for a profile.

The outbox (`Notification`): one row per (event, recipient, channel), made
after the event's commit and sent by the workers (docs/notifications.md).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from sessions_app.models import AgentProfile, Session

CHANNELS = ("email", "webhook")
# pending: due at due_at; claimed: a sender holds it and has not started the send (its
# lease ends at due_at); sending: the send has started (a sender that dies now leaves it
# unknown, not resent); sent; unknown; failed: the attempts ran out; dropped: the person
# or profile turned the channel off meanwhile.
STATUSES = ("pending", "claimed", "sending", "sent", "unknown", "failed", "dropped")
OPEN = ("pending", "claimed", "sending")


class PersonNotifications(models.Model):
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="notify_settings"
    )
    email = models.BooleanField(default=True, help_text="Email me at my account's address.")
    webhook_url = models.CharField(max_length=2000, blank=True)
    # Write-only through every door: shown masked, never logged (notify_app/services.py).
    webhook_secret = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "person's notification settings"
        verbose_name_plural = "people's notification settings"

    def __str__(self) -> str:
        return f"notifications of user {self.user_id}"


class ProfileNotifications(models.Model):
    profile = models.OneToOneField(
        AgentProfile, on_delete=models.CASCADE, primary_key=True, related_name="notify_settings"
    )
    email = models.BooleanField(default=True, help_text="Its sessions' notifications may go by email.")
    webhook = models.BooleanField(default=True, help_text="Its sessions' notifications may go to webhooks.")

    class Meta:
        verbose_name = "profile's notification channels"
        verbose_name_plural = "profiles' notification channels"

    def __str__(self) -> str:
        return f"notification channels of {self.profile_id}"


class Notification(models.Model):
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=64)  # the event's kind
    name = models.CharField(max_length=64)  # the notification's (the webhook body's "event")
    recipient = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    channel = models.CharField(max_length=16, choices=[(c, c) for c in CHANNELS])
    summary = models.TextField()
    status = models.CharField(max_length=16, choices=[(s, s) for s in STATUSES], default="pending")
    # When a sender should look at the row next: a pending row's next attempt, a claimed
    # or sending row's lease expiry; null once it is closed.
    due_at = models.DateTimeField(null=True, blank=True, default=timezone.now)
    attempts = models.PositiveIntegerField(default=0)
    claim = models.CharField(max_length=32, blank=True)  # the current claim's token
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session", "seq", "recipient", "channel"], name="notification_event_recipient_channel"
            )
        ]
        indexes = [models.Index(fields=["due_at"], condition=Q(status__in=OPEN), name="notification_due")]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.name} to {self.recipient_id} by {self.channel}"
