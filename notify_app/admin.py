"""The admin: each profile's notification channels (an inline on the
profile's page); people's settings (the secret never shown); the outbox, read-only, with "send again" for rows whose
outcome is unknown or whose attempts ran out."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from notify_app import outbox, services
from notify_app.models import Notification, PersonNotifications, ProfileNotifications


class ProfileNotificationsInline(admin.StackedInline):  # type: ignore[type-arg]
    """On the profile's own page (sessions_app/admin.py): which channels its sessions' notifications use."""

    model = ProfileNotifications
    can_delete = False
    max_num = 1
    verbose_name_plural = "notification channels (none saved: email and webhooks both on)"


@admin.register(PersonNotifications)
class PersonNotificationsAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "email", "webhook_url")
    fields = ("user", "email", "webhook_url", "secret")
    readonly_fields = ("user", "webhook_url", "secret")

    @admin.display(description="webhook secret")
    def secret(self, obj: PersonNotifications) -> str:
        return services.mask(obj.webhook_secret) or "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # made by the person on the settings page


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "name", "session", "seq", "recipient", "channel", "status", "attempts", "created_at")
    list_filter = ("status", "channel", "name")
    actions = ("send_again",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Notification._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Send again (unknown or failed only)")
    def send_again(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        count = outbox.requeue(list(queryset.values_list("id", flat=True)))
        messages.info(request, f"{count} notification(s) will be sent again.")
