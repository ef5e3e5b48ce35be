"""Building one statement's text and its parameters together, in text order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Sql:
    """SQL text with its parameters, added side by side so they can never
    fall out of order (no index arithmetic on a parameter list)."""

    def __init__(self, text: str = "", *params: Any) -> None:
        self.parts: list[str] = [text] if text else []
        self.params: list[Any] = list(params)

    def add(self, text: str, *params: Any) -> Sql:
        self.parts.append(text)
        self.params.extend(params)
        return self

    def extend(self, other: Sql) -> Sql:
        self.parts.extend(other.parts)
        self.params.extend(other.params)
        return self

    def join(self, separator: str, pieces: Iterable[Sql]) -> Sql:
        for i, piece in enumerate(pieces):
            if i:
                self.parts.append(separator)
            self.extend(piece)
        return self

    @property
    def text(self) -> str:
        return "".join(self.parts)
