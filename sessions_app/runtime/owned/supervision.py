"""One generation's hold on a task, as its kind's run sees it, and how the
run ended (supervise.py runs kinds with these)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from sessions_app import log
from sessions_app.runtime.owned import store

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settlement:
    """How a kind's run ended: a terminal phase with its outcome, or lost
    (its generation was superseded: nothing more is written)."""

    phase: str
    outcome: dict[str, Any] | None
    reason: dict[str, Any] | None

    @staticmethod
    def lost() -> Settlement:
        return Settlement("", None, None)

    @staticmethod
    def parked() -> Settlement:
        """Parked in `waiting` (a subagent's child runs on its own): settled later, by what it waits on."""
        return Settlement("waiting", None, None)


class Supervision:
    """One generation's hold on a task, handed to its kind's run."""

    def __init__(self, claim: store.Claim) -> None:
        self.task = claim.task
        self.generation = claim.generation
        self._progress_due = time.monotonic() + settings.TERRET_TASK_PROGRESS_SECONDS
        self._started = time.monotonic()

    def checkpoint(self, data: dict[str, Any]) -> bool:
        return store.set_process(self.task.id, self.generation, None, checkpoint=data)

    def record_process(self, pgid: int, data: dict[str, Any]) -> bool:
        return store.set_process(self.task.id, self.generation, pgid, checkpoint=data)

    def renew(self, tail: str | None = None) -> store.Renewal:
        return store.renew(self.task.id, self.generation, tail=tail)

    def progress(self, output: str, age_s: float) -> None:
        """task/progress in the owner's log, at most once a TERRET_TASK_PROGRESS_SECONDS."""
        if time.monotonic() < self._progress_due:
            return
        self._progress_due = time.monotonic() + settings.TERRET_TASK_PROGRESS_SECONDS
        data = {"task_id": str(self.task.id), "age_s": round(age_s, 1), "output": output[-2000:]}
        try:
            log.append(self.task.session_id, "task/progress", data)
        except Exception:
            logger.warning("task %s: progress not logged", self.task.id, exc_info=True)
