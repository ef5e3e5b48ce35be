"""The documented pattern syntax (docs/policies.md)."""

from __future__ import annotations

import pytest

from policies_app.patterns import (
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    InvalidPattern,
    allowed,
    matches,
    parse_lines,
    pattern_error,
    validate_patterns,
)
from sessions_app.errors import InvalidInput


@pytest.mark.parametrize(
    "pattern, name, expected",
    [
        ("workspace.*", "workspace.write", True),
        ("workspace.*", "workspace.read", True),
        ("workspace.*", "workspace", False),  # the dot is literal
        ("workspace.*", "workspaces.read", False),
        ("mcp.time.*", "mcp.time.get_current_time", True),
        ("mcp.time.*", "mcp.timer.x", False),
        ("mcp.*", "mcp.time.get_current_time", True),  # * crosses dots
        ("*", "clock.now", True),
        ("*", "mcp.a.b", True),
        ("clock.now", "clock.now", True),
        ("clock.now", "clock.nowx", False),  # whole-name match
        ("clock.now", "xclock.now", False),
        ("clock.no?", "clock.now", True),
        ("clock.no?", "clock.no", False),
        ("Clock.now", "clock.now", False),  # case-sensitive
        ("*.write", "workspace.write", True),
        ("debug.*", "debug.noop", True),
        ("a-b_c.*", "a-b_c.d", True),
    ],
)
def test_matching(pattern: str, name: str, expected: bool) -> None:
    assert pattern_error(pattern) is None
    assert matches(name, pattern) is expected


def test_regex_metacharacters_are_not_special() -> None:
    # Only letters, digits, _ - . * ? are accepted, so nothing else can leak
    # into the regex; '.' in a pattern is a literal dot.
    assert matches("workspaceXwrite", "workspace.write") is False


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("", "empty"),
        (" ", "whitespace"),
        ("clock now", "whitespace"),
        ("clock.now\n", "whitespace"),
        ("clock.[a-z]", "not allowed"),
        ("clock/now", "not allowed"),
        ("clöck.now", "not allowed"),
        (".clock", "dot"),
        ("clock.", "dot"),
        ("clock..now", "dot"),
        ("x" * (MAX_PATTERN_CHARS + 1), "at most"),
        (5, "string"),
        (None, "string"),
    ],
)
def test_bad_patterns_are_explained(pattern: object, message: str) -> None:
    error = pattern_error(pattern)
    assert error is not None and message in error


def test_validate_names_every_bad_pattern() -> None:
    with pytest.raises(InvalidPattern) as info:
        validate_patterns(["clock.*", "bad pattern", "x/y"])
    text = str(info.value)
    assert "pattern 2 ('bad pattern')" in text and "pattern 3 ('x/y')" in text and "pattern 1" not in text
    assert info.value.code == "invalid_pattern" and info.value.status == 400
    assert isinstance(info.value, InvalidInput)


def test_validate_shape_and_limits() -> None:
    assert validate_patterns(["a.*", "b", "a.*"]) == ["a.*", "b"]  # de-duplicated, order kept
    assert validate_patterns([]) == []  # an empty policy is valid: it denies everything
    for bad in ["clock.*", None, {"a": 1}, 3]:
        with pytest.raises(InvalidPattern, match="list of strings"):
            validate_patterns(bad)
    with pytest.raises(InvalidPattern, match=f"at most {MAX_PATTERNS}"):
        validate_patterns([f"t{i}" for i in range(MAX_PATTERNS + 1)])


def test_deny_by_default_and_invalid_patterns_allow_nothing() -> None:
    assert allowed("clock.now", []) is False
    assert allowed("clock.now", ["workspace.*"]) is False
    assert allowed("clock.now", ["workspace.*", "clock.*"]) is True
    assert allowed("clock now", ["clock now"]) is False  # an invalid pattern never matches


def test_editor_lines() -> None:
    assert parse_lines("  workspace.*\n\n clock.now \r\n") == ["workspace.*", "clock.now"]
