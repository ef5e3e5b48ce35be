"""Fault injection for crash tests: pause a worker at a named point of a
tool call, so a test can `kill -9` it exactly there.

Points: `after_intent` (the tool/attempt is committed, the tool has not run)
and `after_effect` (the tool ran, its tool/result is not committed); for
the notification sender (sessions_app/notify/delivery.py), `notify_claimed` (a row
claimed, nothing sent) and `notify_sent` (sent, not marked), keyed by the
channel (email, webhook) where a tool's name goes; for a monitor's period
(sessions_app/monitors/run.py), `monitor_scan` (pages read, nothing
committed), `monitor_intent` (the edition posting, nothing sent) and
`monitor_sent` (sent, the receipt not committed), keyed `monitor`; for an
owned task (sessions_app/runtime/owned/supervise.py), keyed by its kind
(command, subagent): `task_start` (its start taken, the task still pending),
`task_claimed` (claimed and running, its kind's run not begun: no process
spawned, no child woken), `task_held` (its outcome held in `completing`, the
receipt not committed) and `task_child_idle` (a child's turn ended, its
subagent task not yet settled). They are set per tool
with TERRET_FAILPOINTS=`<point>:<tool>=<seconds>,...`, read once at start;
unset (always, outside tests) a point costs one dict lookup.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings

logger = logging.getLogger(__name__)


def pause(point: str, tool: str) -> None:
    seconds = settings.TERRET_FAILPOINTS.get((point, tool)) if settings.TERRET_FAILPOINTS else None
    if seconds:
        logger.warning("failpoint %s:%s: pausing %.1fs (TERRET_FAILPOINTS)", point, tool, seconds)
        time.sleep(seconds)
