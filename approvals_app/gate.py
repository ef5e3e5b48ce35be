"""The approval gate. It runs at execute, after every pre_execute veto has
settled, so a call the allow-list refuses never reaches a human."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from approvals_app.selectors import request_in_turn, verdict_in_turn
from sessions_app.selectors import LoggedEvent
from sessions_app.tools.base import Definition


def approval_mode(defn: Definition, overrides: dict[str, Any]) -> str:
    mode = overrides.get(defn.name, defn.approval)
    return mode if mode in ("never", "policy", "always") else "always"


def needs_approval(defn: Definition, overrides: dict[str, Any]) -> bool:
    mode = approval_mode(defn, overrides)
    return mode == "always" or (mode == "policy" and defn.mutating)


@dataclass(frozen=True)
class GateDecision:
    action: Literal["run", "deny", "park", "ask"]
    reason: str = ""


def check(
    events: list[LoggedEvent], defn: Definition, overrides: dict[str, Any], call_id: str, args: Any
) -> GateDecision:
    """run: go ahead; deny: a recorded denial; park: asked, no verdict yet;
    ask: append approval/requested, then park. Verdicts come from the log, so
    after a restart a decided call is never asked again."""
    if not needs_approval(defn, overrides):
        return GateDecision("run")
    verdict = verdict_in_turn(events, call_id, defn.name, args)
    if verdict is not None:
        if verdict.verdict == "approve":
            return GateDecision("run")
        return GateDecision("deny", verdict.reason or "denied by reviewer")
    if request_in_turn(events, call_id, defn.name, args) is not None:
        return GateDecision("park")
    return GateDecision("ask")
