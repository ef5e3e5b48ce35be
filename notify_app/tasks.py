"""The sender's Celery task and thread: thin adapters over notify_app.delivery.

The task takes outbox ids and is safe to run twice (each send starts with a
claim). Every worker also runs the sender thread from its start.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_ready

from notify_app import delivery


@shared_task(name=delivery.NOTIFY_TASK, ignore_result=True)
def send_notifications(ids: list[int]) -> dict[int, str]:
    return delivery.deliver_many([int(i) for i in ids])


@worker_ready.connect
def _start_sender(**_: Any) -> None:
    delivery.start_sender()
