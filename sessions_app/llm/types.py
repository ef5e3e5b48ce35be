"""Types shared by the turn loop and every model adapter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

DEMO_SPEC = "demo/offline"


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about one tool. `name` is Terret's name
    (dotted, e.g. workspace.write); adapters map it to the wire format."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, exactly as the model produced it


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cost: float | None = None  # None: the provider did not price it

    def as_json(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "cost": self.cost}


@dataclass(frozen=True)
class ModelReply:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None


class ModelError(Exception):
    """The model call failed; the step cannot go on."""


class TornStream(ModelError):
    """The stream ended before the provider said it was done."""


class ModelUnavailable(ModelError):
    """Retries are exhausted (timeouts, 429, 5xx) or the provider refused the request."""


class ModelNotConfigured(ModelError):
    """A role has no model and no fallback applies."""


DeltaSink = Callable[[str], None]


class Adapter(Protocol):
    def complete(
        self,
        spec: str,
        messages: list[dict[str, Any]],
        tools: list[ToolSpec],
        on_delta: DeltaSink | None = None,
    ) -> ModelReply: ...
