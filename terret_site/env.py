"""Typed readers for settings that come from the environment.

Every reader fails loudly (ImproperlyConfigured) on a value it cannot parse:
a typo in DEBUG or DATABASE_URL must stop the process at start, not surface
as odd behaviour a week later.
"""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip()


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be >= {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be >= {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise ImproperlyConfigured(f"{name}={raw!r} has an empty item; use a comma-separated list")
    return items


def env_url(name: str, default: str | None, *, schemes: set[str]) -> str | None:
    raw = env_str(name, default)
    if raw is None or raw == "":
        return None
    parsed = urlparse(raw)
    if parsed.scheme not in schemes:
        raise ImproperlyConfigured(f"{name}={raw!r}: scheme must be one of {sorted(schemes)}")
    return raw


def env_pauses(name: str, points: frozenset[str]) -> dict[tuple[str, str], float]:
    """`point:tool=seconds,...` (e.g. `after_intent:workspace.write=5`) as
    {(point, tool): seconds}; an unknown point or a bad number stops the process."""
    out: dict[tuple[str, str], float] = {}
    for item in env_list(name, []):
        spec, _, seconds = item.partition("=")
        point, _, tool = spec.partition(":")
        if point not in points or not tool:
            known = ", ".join(sorted(points))
            raise ImproperlyConfigured(f"{name}: {item!r} must be <point>:<tool>=<seconds>, point one of {known}")
        try:
            value = float(seconds)
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r}: {seconds!r} is not a number of seconds") from None
        if not 0 <= value <= 600:
            raise ImproperlyConfigured(f"{name}: {item!r}: seconds must be from 0 to 600")
        out[(point, tool)] = value
    return out


def env_limit(name: str, *, decimal: bool = False, default: Decimal | int | None = None) -> Decimal | int | None:
    """An optional non-negative limit: unset is `default`, empty is no limit."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.strip() == "":
        return None
    try:
        value: Decimal | int = Decimal(raw.strip()) if decimal else int(raw)
    except (ValueError, InvalidOperation):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a {'number' if decimal else 'whole number'}") from None
    if value < 0 or (decimal and not Decimal(value).is_finite()):
        raise ImproperlyConfigured(f"{name}={raw!r} must be a finite number >= 0")
    return value
