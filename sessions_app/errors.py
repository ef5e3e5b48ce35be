"""Domain errors. Each has a stable `code` used by the JSON API and socket frames."""

from __future__ import annotations


class TerretError(Exception):
    code = "error"
    status = 400


class AgentExists(TerretError):
    code = "agent_exists"
    status = 409


class AgentCapExceeded(TerretError):
    code = "agent_cap_exceeded"
    status = 429


class AgentBusy(TerretError):
    code = "agent_busy"
    status = 409


class NoAgent(TerretError):
    code = "no_agent"
    status = 409


class TurnAlreadyRunning(TerretError):
    code = "turn_already_running"
    status = 409


class TurnOpenInLog(TerretError):
    code = "turn_open_in_log"
    status = 409


class IdempotencyConflict(TerretError):
    code = "idempotency_conflict"
    status = 409


class InvalidInput(TerretError):
    code = "invalid_input"
    status = 400
