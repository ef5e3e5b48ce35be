"""Types shared by the turn loop and every model adapter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sessions_app.llm.abort import Abort

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
    """The model call failed; the step cannot go on.

    `transient` says whether the same request may succeed later (an outage,
    a throttle, a torn stream, a deadline). The runtime decides what a
    failure means for a turn from this attribute alone (runtime/failures.py)."""

    transient = False
    # What the provider reported spending on the call before it failed (a
    # stream torn after its usage chunk, a deadline): recorded, never lost.
    usage: Usage | None = None


class TornStream(ModelError):
    """The stream ended before the provider said it was done."""

    transient = True


class ModelUnavailable(ModelError):
    """Retries are exhausted (timeouts, 408, 429, 5xx, connection errors)."""

    transient = True


class ModelDeadline(ModelUnavailable):
    """The call ran past TERRET_LLM_DEADLINE_SECONDS (keep-alives do not extend it)."""


class ModelRejected(ModelError):
    """The provider refused the request (a 4xx other than 408 and 429: a bad
    request, an unknown model, a bad key); the same request will fail again."""


class ContextTooLong(ModelRejected):
    """The request does not fit the model's context window (the provider said
    so: llm/openai.py `context_error`). Permanent: the same messages fail
    again; only a shorter request (compaction) can succeed. `limit_tokens`
    and `requested_tokens` are the provider's figures, None when its message
    gave none."""

    def __init__(self, message: str, limit_tokens: int | None = None, requested_tokens: int | None = None) -> None:
        super().__init__(message)
        self.limit_tokens = limit_tokens
        self.requested_tokens = requested_tokens

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (Celery, multiprocessing) with its figures, not just the message.
        return (type(self), (str(self), self.limit_tokens, self.requested_tokens))


class ModelNotConfigured(ModelError):
    """A role has no model and no fallback applies."""


class ModelCancelled(ModelError):
    """A cancel stopped the call; `partial` holds what had streamed (text,
    and usage if the provider had sent it)."""

    def __init__(self, message: str, partial: ModelReply | None = None) -> None:
        super().__init__(message)
        self.partial = partial or ModelReply(content=None)


DeltaSink = Callable[[str], None]


class Adapter(Protocol):
    def complete(
        self,
        spec: str,
        messages: list[dict[str, Any]],
        tools: list[ToolSpec],
        on_delta: DeltaSink | None = None,
        abort: Abort | None = None,
    ) -> ModelReply: ...


# -- what a tool result carries besides text -----------------------------------


class ToolText(str):
    """A tool's text result that also carries what cannot be text: images,
    as `attachments` ({"type": "image", "mime_type": ..., "data": base64}).

    It is a str, so every handler contract and the executor stay as they are;
    the runner stores the attachments beside the text in tool/result (bounded
    by runtime/storable.py), and the projection hands them to the adapter.
    The text already describes each image ("[image 1: image/png, 95 bytes]"),
    so a model that takes no images, or a copy of the text that lost the
    attachments, still reads what the tool returned."""

    attachments: tuple[dict[str, Any], ...]

    def __new__(cls, text: str, attachments: tuple[dict[str, Any], ...] | list[dict[str, Any]] = ()) -> ToolText:
        obj = super().__new__(cls, text)
        obj.attachments = tuple(attachments)
        return obj


IMAGES_NOT_SHOWN = "[{n} image(s) returned by this tool are described above but not shown: this model takes text only]"


def for_model(messages: list[dict[str, Any]], *, images: bool) -> list[dict[str, Any]]:
    """The projection's messages prepared for a model that does (`images`) or
    does not take images. A tool message's `attachments` become `images` (the
    adapter sends them as image parts) or a line saying they are not shown.
    Messages without attachments are passed through as they are."""
    if not any(m.get("attachments") for m in messages):
        return messages
    out = []
    for message in messages:
        attached = message.get("attachments")
        if not attached:
            out.append(message)
            continue
        rest = {k: v for k, v in message.items() if k != "attachments"}
        pictures = [a for a in attached if a.get("type") == "image"]
        if images and pictures:
            rest["images"] = pictures
        elif pictures:
            rest["content"] = f"{rest.get('content') or ''}\n{IMAGES_NOT_SHOWN.format(n=len(pictures))}"
        out.append(rest)
    return out
