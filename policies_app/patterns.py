"""Allow-list pattern syntax.

A pattern is a glob over dotted tool names (`clock.now`, `workspace.write`,
`mcp.time.get_current_time`), matched case-sensitively against the whole name:

- `*` matches any run of characters, dots included: `workspace.*` matches
  `workspace.write`, `mcp.*` matches every MCP tool, `*` matches every tool.
- `?` matches exactly one character (a dot included).
- Everything else matches itself. There are no character classes.

Allowed characters: letters, digits, `_`, `-`, `.`, `*`, `?`. A pattern may
not be empty, contain whitespace, start or end with a dot, or hold an empty
segment (`a..b`); it is at most MAX_PATTERN_CHARS long, and a policy holds at
most MAX_PATTERNS patterns.

Why `*` crosses dots: MCP tools are named `mcp.<server>.<tool>` and people
write `mcp.*` meaning "all of them"; a per-segment star would make `*` and
`mcp.*` silently match much less than they read. The cost is that
`mcp.time*` also matches `mcp.timer.x`: end a prefix with `.*` to stay within
one server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from sessions_app.errors import InvalidPattern

MAX_PATTERN_CHARS = 200
MAX_PATTERNS = 100
_CHARS = re.compile(r"[A-Za-z0-9_.*?-]+")


def pattern_error(pattern: Any) -> str | None:
    """Why `pattern` is not a valid pattern, or None."""
    if not isinstance(pattern, str):
        return "a pattern must be a string"
    if not pattern:
        return "a pattern must not be empty"
    if any(ch.isspace() for ch in pattern):
        return "a pattern must not contain whitespace"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"a pattern is at most {MAX_PATTERN_CHARS} characters"
    if not _CHARS.fullmatch(pattern):
        bad = sorted({ch for ch in pattern if not _CHARS.fullmatch(ch)})
        shown = " ".join(repr(ch) for ch in bad)
        return f"characters not allowed: {shown} (use letters, digits, _ - . and the wildcards * ?)"
    if pattern.startswith(".") or pattern.endswith(".") or ".." in pattern:
        return "a pattern must not start or end with a dot or contain an empty segment (..)"
    return None


def validate_patterns(patterns: Any) -> list[str]:
    """A clean, de-duplicated list (order kept), or InvalidPattern naming every bad entry."""
    if isinstance(patterns, str) or not isinstance(patterns, list | tuple):
        raise InvalidPattern("patterns must be a list of strings")
    if len(patterns) > MAX_PATTERNS:
        raise InvalidPattern(f"a policy holds at most {MAX_PATTERNS} patterns, got {len(patterns)}")
    problems = []
    for n, pattern in enumerate(patterns, 1):
        error = pattern_error(pattern)
        if error:
            problems.append(f"pattern {n} ({pattern!r}): {error}")
    if problems:
        raise InvalidPattern("; ".join(problems))
    return list(dict.fromkeys(patterns))


def parse_lines(text: str) -> list[str]:
    """Editor input: one pattern per line; blank lines and surrounding spaces are ignored."""
    return [line.strip() for line in text.splitlines() if line.strip()]


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    parts = ["." if ch == "?" else ".*" if ch == "*" else re.escape(ch) for ch in pattern]
    return re.compile("".join(parts), re.DOTALL)


def matches(name: str, pattern: str) -> bool:
    return _compile(pattern).fullmatch(name) is not None


def allowed(name: str, patterns: Iterable[str]) -> bool:
    """Deny by default: a name is allowed only if some valid pattern matches it."""
    return any(pattern_error(p) is None and matches(name, p) for p in patterns)
