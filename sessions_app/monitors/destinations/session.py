"""The `session` destination: the digest as a `monitor/edition` event in the
monitor's own session; the receipt is the event's seq. Local, so there is no
outcome to be unsure of: the event, the edition's confirmation and the
delivery ledger commit in one transaction (run.py `publish`)."""

from __future__ import annotations

from typing import Any

from sessions_app.monitors.destinations.base import Outcome, Publication, Unknown


class SessionDestination:
    name = "session"
    version = 1
    idempotent = True
    local = True

    def check(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "session"}

    def key(self, config: dict[str, Any]) -> str:
        return "session"

    def send(self, config: dict[str, Any], p: Publication) -> Outcome:
        # Never called: run.publish appends the event itself, inside the edition's own transaction.
        return Unknown("the session destination is published locally")
