"""The model providers this installation is configured for, and whether a
model spec can be reached at all: the admin's model field and the chat's
model picker say so before a turn fails on it with a transport error.

Two providers exist (llm/registry.py picks between them): the offline demo
(`demo/...`, no network, no key) and the OpenAI-compatible endpoint at
TERRET_LLM_BASE_URL for every other spec, which needs TERRET_LLM_API_KEY.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from sessions_app.llm.types import DEMO_SPEC

KEY_SETTING = "TERRET_LLM_API_KEY"


@dataclass(frozen=True)
class Provider:
    name: str
    prefix: str  # the specs it serves start with this ("" for every other spec)
    where: str
    has_key: bool
    examples: tuple[str, ...]
    needs_key: bool = True

    @property
    def warning(self) -> str | None:
        """Why a model of this provider cannot be reached now, or None."""
        if self.has_key:
            return None
        return f"no API key: set {KEY_SETTING} in the environment, or its models cannot be reached"

    def label(self) -> str:
        state = self.warning or ("API key set" if self.needs_key else "no key needed")
        return f"{self.name} ({self.where}): {state}"


def providers() -> list[Provider]:
    """The demo first, then the configured endpoint, read from settings on each call."""
    configured = [m for m in (settings.TERRET_MODEL_MAIN, "openai/gpt-4o-mini") if m]
    return [
        Provider("demo", "demo/", "offline, built in", True, (DEMO_SPEC,), needs_key=False),
        Provider(
            "openai-compatible",
            "",
            str(settings.TERRET_LLM_BASE_URL),
            bool(settings.TERRET_LLM_API_KEY),
            tuple(dict.fromkeys(configured)),
        ),
    ]


def provider_of(spec: str) -> Provider:
    found = providers()
    return next((p for p in found if p.prefix and spec.strip().startswith(p.prefix)), found[-1])


def unreachable(spec: str) -> str | None:
    """Why `spec` cannot be reached (naming the setting to fix), or None."""
    provider = provider_of(spec)
    if provider.warning is None:
        return None
    return f"{spec.strip()} cannot be reached: the {provider.name} provider at {provider.where} has {provider.warning}"
