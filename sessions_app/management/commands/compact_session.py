"""manage.py compact_session <session-id> [...]: compact sessions by hand.

Exit status 0 when every session was compacted or declined (a live turn, nothing
new, Morph declining), 1 when a summarizer failed or was not configured, or a
session does not exist. `--check-usage` compares each session's running
totals with its log instead.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app.errors import TerretError
from sessions_app.log import SessionNotFound
from sessions_app.models import Session
from sessions_app.services import compaction
from sessions_app.services.usage import check_session


class Command(BaseCommand):
    help = "Compact the given sessions now (between turns only); or check their usage totals."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("session_ids", nargs="+", help="session UUIDs")
        parser.add_argument(
            "--check-usage", action="store_true", help="compare running totals with the log, no compaction"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        failures = 0
        for raw in options["session_ids"]:
            try:
                sid = uuid.UUID(raw)
            except ValueError:
                self.stderr.write(f"{raw}: not a session id")
                failures += 1
                continue
            failures += self._check(sid) if options["check_usage"] else self._compact(sid)
        if failures:
            raise CommandError(f"{failures} session(s) failed")

    def _compact(self, sid: uuid.UUID) -> int:
        try:
            outcome = compaction.attempt(sid, manual=True)
        except SessionNotFound:
            self.stderr.write(f"{sid}: no such session")
            return 1
        except TerretError as exc:
            self.stderr.write(f"{sid}: compaction failed: {exc}")
            return 1
        if isinstance(outcome, compaction.CompactionResult):
            self.stdout.write(f"{sid}: compacted up to #{outcome.upto_seq} (event #{outcome.seq}, {outcome.model})")
        else:
            self.stdout.write(f"{sid}: declined: {outcome.reason}")
        return 0

    def _check(self, sid: uuid.UUID) -> int:
        try:
            ok, running, summed = check_session(sid)
        except Session.DoesNotExist:
            self.stderr.write(f"{sid}: no such session")
            return 1
        if ok:
            self.stdout.write(f"{sid}: usage totals match the log ({running.cost_display}, {running.steps} steps)")
            return 0
        self.stderr.write(f"{sid}: MISMATCH running={running.as_dict()} log={summed.as_dict()}")
        return 1
