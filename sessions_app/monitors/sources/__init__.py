"""Source kinds, one module per kind, in a registry keyed by name and
version (like the tools): a monitor's source names its kind, and a kind
the registry does not hold is refused at creation and blocks the period
(`definition_missing`) rather than being guessed at."""

from __future__ import annotations

from sessions_app.monitors.sources.base import COVERAGES, Item, Kind, Scan
from sessions_app.monitors.sources.feed import Feed
from sessions_app.monitors.sources.http_json import HttpJson
from sessions_app.monitors.sources.mcp import Mcp

__all__ = ["COVERAGES", "Item", "Kind", "Scan", "get", "names"]

_kinds: dict[str, Kind] = {k.name: k for k in (Feed(), HttpJson(), Mcp())}


def get(name: str) -> Kind | None:
    return _kinds.get(name)


def names() -> list[str]:
    return sorted(_kinds)
