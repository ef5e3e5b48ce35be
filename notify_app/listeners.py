"""After-commit listener: a committed event that needs a human becomes
outbox rows (rules.RULES says which kinds, and who), then a wake-up for the
sender. The rows are made once per (event, recipient, channel).
"""

from __future__ import annotations

from notify_app import delivery, outbox
from notify_app.rules import RULES
from sessions_app.log import AppendedEvent, on_event


@on_event(*RULES)
def notify(event: AppendedEvent) -> None:
    delivery.wake(outbox.enqueue(event))
