"""What a source kind is and what its scan answers (the registry is the package)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

COVERAGES = ("complete", "partial", "failed")


@dataclass(frozen=True)
class Item:
    """One item version: a stable identity, and a version that changes when the item is updated."""

    id: str
    version: str
    title: str
    url: str
    time: datetime | None


@dataclass
class Scan:
    """What a scan read and what it can prove: `complete` only when the
    interval since the checkpoint was exhausted (the boundary seen)."""

    coverage: str
    items: list[Item] = field(default_factory=list)
    pages: int = 0
    boundary: datetime | None = None  # the checkpoint value the scan proved it reached
    checkpoint: datetime | None = None  # the new checkpoint (complete scans only)
    error: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


class Kind(Protocol):
    name: str
    version: int

    def check(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config cleaned, or InvalidInput/UnsafeUrl."""

    def revision(self, config: dict[str, Any]) -> str:
        """What identifies the query: a change starts a new checkpoint."""

    def scan(self, config: dict[str, Any], checkpoint: datetime | None, initialized: bool) -> Scan:
        """Read from the checkpoint (minus the overlap) to now."""
