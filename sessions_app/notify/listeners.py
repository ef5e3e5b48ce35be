"""After-commit listener: a committed event that needs a human becomes
outbox rows (rules.RULES says which kinds, and who), then a wake-up for the
sender. The rows are made once per (event, recipient, channel).

The wake-up is the sender's (delivery.wake, services-level, above this
plugin): sessions_app/apps.py hands it over with `set_waker`. Until then, or
if it is lost, each worker's sender thread finds the rows by itself.
"""

from __future__ import annotations

from collections.abc import Callable

from sessions_app.log import AppendedEvent, on_event
from sessions_app.notify import outbox
from sessions_app.notify.rules import RULES

Waker = Callable[[list[int]], None]


def _no_wake(ids: list[int]) -> None:
    return None


_waker: Waker = _no_wake


def set_waker(waker: Waker) -> None:
    global _waker
    _waker = waker


@on_event(*RULES)
def notify(event: AppendedEvent) -> None:
    _waker(outbox.enqueue(event))
