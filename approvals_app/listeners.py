"""After-commit listeners: tell reviewers' live queues that something changed.

The message is only a hint ("refetch your queue"): it carries no call data,
so a reviewer's queue is always read through the permission-checked view.
"""

from __future__ import annotations

from sessions_app.log import AppendedEvent, hints, on_event

GROUP = "approvals"


@on_event("approval/requested", "approval/resolved", "approval/expired")  # an expiry that denies leaves the queue
def publish_queue_hint(event: AppendedEvent) -> None:
    hints.publisher.message(GROUP, {"type": "approvals.changed", "session": str(event.session_id), "seq": event.seq})
