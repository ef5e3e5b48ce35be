"""Run one tool call: parse, validate, call the handler, bound the result.

Whatever goes wrong ends up as an error outcome the model can read; nothing
here raises into the turn loop. Validation happens before the handler runs,
so handlers can rely on their schema.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jsonschema_rs

from .base import Definition, ToolContext, ToolError

logger = logging.getLogger(__name__)

MAX_RESULT_BYTES = 64 * 1024
MAX_ARGUMENT_CHARS = 1024 * 1024
_MAX_ERRORS_SHOWN = 3
_MAX_ERROR_CHARS = 300
_MAX_QUOTE_CHARS = 60
_VALIDATORS_KEPT = 512


@dataclass(frozen=True)
class ToolOutcome:
    content: str
    is_error: bool


def execute(defn: Definition, ctx: ToolContext, arguments: str) -> ToolOutcome:
    try:
        args = _parse(arguments)
        _validate(defn, args)
        result = defn.handler(ctx, args)
        if not isinstance(result, str):
            raise TypeError(f"handler returned {type(result).__name__}, not str")
    except ToolError as exc:
        return _outcome(str(exc) or f"{defn.name} failed", is_error=True)
    except Exception as exc:
        logger.exception("tool %s failed unexpectedly (session %s, call %s)", defn.name, ctx.session_id, ctx.call_id)
        return _outcome(f"internal error in {defn.name} ({type(exc).__name__})", is_error=True)
    return _outcome(result, is_error=False)


def _parse(arguments: str) -> dict[str, Any]:
    # Models send "" for tools without parameters often enough to accept it.
    if not arguments.strip():
        return {}
    if len(arguments) > MAX_ARGUMENT_CHARS:
        raise ToolError(f"arguments are longer than {MAX_ARGUMENT_CHARS} characters")
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ToolError(f"arguments are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise ToolError(f"arguments must be a JSON object, not {type(value).__name__}")
    return value


def _validate(defn: Definition, args: dict[str, Any]) -> None:
    problems = []
    for error in _validator(defn.parameters).iter_errors(args):
        where = "/".join(str(part) for part in error.instance_path)
        problems.append(f"{where or '(root)'}: {_describe(error)}")
        if len(problems) == _MAX_ERRORS_SHOWN:
            break
    if problems:
        raise ToolError(f"invalid arguments for {defn.name}: " + "; ".join(problems))


def _describe(error: jsonschema_rs.ValidationError) -> str:
    # Messages quote the offending value, which may be huge; shorten the
    # quote rather than the message, so the reason itself survives.
    quoted = json.dumps(error.instance, ensure_ascii=False, separators=(",", ":"))
    message = error.message
    if len(quoted) > _MAX_QUOTE_CHARS and message.startswith(quoted):
        message = quoted[:_MAX_QUOTE_CHARS] + "…" + message[len(quoted) :]
    return _clip(message)


class _ValidatorCache:
    """Compiled validators by schema text: Definitions are rebuilt per
    registry, but their schemas rarely change, and compiling is not free."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, jsonschema_rs.Validator] = OrderedDict()

    def get(self, schema: dict[str, Any]) -> jsonschema_rs.Validator:
        key = json.dumps(schema, sort_keys=True)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        # Offline: a schema from an MCP server must not make us fetch URLs.
        validator = jsonschema_rs.validator_for(schema, offline=True)
        with self._lock:
            self._items[key] = validator
            while len(self._items) > _VALIDATORS_KEPT:
                self._items.popitem(last=False)
        return validator


_validators = _ValidatorCache()


def _validator(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    try:
        return _validators.get(schema)
    except (ValueError, jsonschema_rs.ReferencingError) as exc:
        logger.warning("unusable parameter schema: %s", _clip(str(exc)))
        raise ToolError("this tool's parameter schema is invalid, so it cannot be called") from None


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "…"


def _outcome(content: str, *, is_error: bool) -> ToolOutcome:
    data = content.encode("utf-8", errors="replace")
    if len(data) <= MAX_RESULT_BYTES:
        return ToolOutcome(content, is_error)
    kept = data[:MAX_RESULT_BYTES].decode("utf-8", errors="ignore")
    note = f"\n[truncated: the result was {len(data)} bytes; only the first {MAX_RESULT_BYTES} are shown]"
    return ToolOutcome(kept + note, is_error)
