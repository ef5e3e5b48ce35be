"""What a destination kind is and the outcomes of a send (the registry is the package)."""

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
    # A local destination (the session itself) is published inside the edition's own transaction.
    local: bool

    def check(self, config: dict[str, Any]) -> dict[str, Any]: ...

    def key(self, config: dict[str, Any]) -> str:
        """The destination's identity, part of an edition's."""

    def send(self, config: dict[str, Any], publication: Publication) -> Outcome: ...
