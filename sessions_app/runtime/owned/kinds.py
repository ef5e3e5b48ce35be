"""The registry of installed task kinds, by name and version.

A task row names its kind and version; a worker resolves them here when it
claims the task (at its start and at every recovery). A name or version the
running code lacks leaves the task `blocked` (definition_missing), visibly
and live, until a worker that has it comes along or someone cancels it: it is
never dropped, never guessed at.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sessions_app.runtime.owned.supervision import Settlement, Supervision


@dataclass(frozen=True)
class TaskKind:
    name: str
    version: int
    run: Callable[[Supervision], Settlement]
    # Whether a task whose supervisor died may run again under a new
    # generation; otherwise it ends failed {code: supervisor_lost}.
    rerunnable: bool = False


_installed: dict[tuple[str, int], TaskKind] = {}


def install(kind: TaskKind) -> None:
    _installed[(kind.name, kind.version)] = kind


def uninstall(name: str, version: int) -> None:
    """For tests that play a worker lacking a kind."""
    _installed.pop((name, version), None)


def resolve(name: str, version: int) -> TaskKind | None:
    return _installed.get((name, version))


def current_version(name: str) -> int | None:
    """The newest installed version of `name`: what a new task is admitted under."""
    versions = [v for (n, v) in _installed if n == name]
    return max(versions) if versions else None


def installed() -> list[tuple[str, int]]:
    return sorted(_installed)
