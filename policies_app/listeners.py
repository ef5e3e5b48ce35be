"""Keep this process's policy cache fresh the moment an update commits.

Correctness does not depend on this listener (every lookup validates its
cache entry against Session.policy_seq); it only saves the next tool call
a read of the event.
"""

from __future__ import annotations

from policies_app.selectors import cache, policy_from_event
from sessions_app.log import AppendedEvent, on_event


@on_event("policy/updated")
def refresh_cache(event: AppendedEvent) -> None:
    cache.put(event.session_id, policy_from_event(event.session_id, event.seq, event.data))
