"""Which adapter serves a model spec, and one-shot utility requests."""

from __future__ import annotations

from typing import Any

from sessions_app.llm.abort import Abort
from sessions_app.llm.demo import DemoAdapter
from sessions_app.llm.openai import OpenAIAdapter
from sessions_app.llm.types import Adapter, ModelNotConfigured, ModelReply

# Process-wide singletons: both are stateless per call (the OpenAI adapter
# reads settings on each call and shares one pooled HTTP client).
_DEMO = DemoAdapter()
_OPENAI = OpenAIAdapter()


def get_adapter(spec: str) -> Adapter:
    if not spec or not spec.strip():
        raise ModelNotConfigured("no model spec given")
    if spec.startswith("demo/"):
        return _DEMO
    return _OPENAI


def complete_utility(spec: str, messages: list[dict[str, Any]], abort: Abort | None = None) -> ModelReply:
    """A one-shot request for a utility role (titler, compactor): no tools, no
    deltas. `abort` stops it as it stops a turn's model call."""
    return get_adapter(spec).complete(spec, messages, [], None, abort=abort)
