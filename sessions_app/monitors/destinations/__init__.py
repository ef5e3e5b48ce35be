"""Destination kinds, one module per kind, in a registry like the sources'.

A destination's `send` answers one of three outcomes, and only the first
confirms: `Confirmed` carries a receipt with a resolvable identity (the
webhook's JSON id, the Message-ID the SMTP server accepted, the event's
seq); `Failed` means the destination certainly did not take it (the
connection was refused, it answered an error); anything else is `Unknown`
(a dropped connection after the request went out, a 200 with no id)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Confirmed:
    receipt: str


@dataclass(frozen=True)
class Failed:
    reason: str


@dataclass(frozen=True)
class Unknown:
    reason: str


Outcome = Confirmed | Failed | Unknown


@dataclass(frozen=True)
class Publication:
    edition_id: str
    monitor_id: str
    session_id: str
    period: int
    digest: str
    items: list[dict[str, Any]]
    coverage: list[dict[str, Any]]
    secret: str


class Kind(Protocol):
    name: str
    version: int
    # Whether re-sending under the same Idempotency-Key is safe: an unknown
    # edition is re-sent automatically only to a destination that honours it.
    idempotent: bool

    def check(self, config: dict[str, Any]) -> dict[str, Any]: ...

    def key(self, config: dict[str, Any]) -> str:
        """The destination's identity, part of an edition's."""

    def send(self, config: dict[str, Any], publication: Publication) -> Outcome: ...


_kinds: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    _kinds[kind.name] = kind
    return kind


def get(name: str) -> Kind | None:
    return _kinds.get(name)


def names() -> list[str]:
    return sorted(_kinds)


def _load() -> None:
    from sessions_app.monitors.destinations import email, webhook  # noqa: F401 - import-time: kinds register


_load()
