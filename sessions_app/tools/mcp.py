"""Stdio MCP servers, reached through the official `mcp` SDK (2.x).

The SDK is async and its client sessions are bound to the event loop and task
that opened them, while Terret's turn loop runs in plain worker threads. So one
per-process manager owns a background event loop thread; each distinct server
config (command, args, env) gets one long-lived client session on that loop,
started on first use. Sync callers hand coroutines to the loop with
`asyncio.run_coroutine_threadsafe` and wait for the answer. Every piece of
manager state is touched only on the loop thread, which is what makes the
manager safe to call from many worker threads at once.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TextIO, TypeVar, cast

import anyio
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client import Transport
from mcp.shared.message import SessionMessage
from mcp.types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallToolResult,
    ContentBlock,
    RequestParamsMeta,
    TextContent,
    Tool,
)
from pydantic import ValidationError

from .base import Definition, Replay, ToolContext, ToolError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Covers spawning, the handshake and tools/list; a server slower than this to
# come up is treated as broken rather than left to stall a turn step.
STARTUP_TIMEOUT = 30.0
DEFAULT_CALL_TIMEOUT = 120.0
MAX_CALL_TIMEOUT = 3600.0
# Slack for the sync side's own wait on top of the SDK's request timeout, so
# the SDK's clearer timeout error normally wins the race.
_WAIT_SLACK = 5.0
_SHUTDOWN_TIMEOUT = 10.0
# After a failed start, calls fail fast for this long instead of each paying
# for another spawn (or another STARTUP_TIMEOUT, for a server that hangs).
START_BACKOFF = 5.0
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The request `_meta` keys a tool call carries its effect-ledger identity in
# (runtime/effects.py): the idempotency key, the same on every attempt of one
# call, so a server can deduplicate; the attempt number; the lease fence.
# Namespaced with a reverse-DNS prefix, as the MCP spec asks of `_meta` keys
# that are not the protocol's own.
META_IDEMPOTENCY_KEY = "io.terret/idempotency_key"
META_ATTEMPT = "io.terret/attempt"
META_FENCE = "io.terret/fence"


class MCPUnavailable(ToolError):
    """The MCP server could not be started or stopped answering."""


@dataclass(frozen=True)
class ServerKey:
    """What identifies one server process: profiles with the same command,
    args and env share it, whatever they call it."""

    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        """For logs and messages; env is left out since it may hold secrets."""
        text = " ".join([self.command, *self.args])
        return text if len(text) <= 120 else text[:117] + "..."

    def parameters(self) -> StdioServerParameters:
        return StdioServerParameters(command=self.command, args=list(self.args), env=dict(self.env) or None)


@dataclass(frozen=True)
class ServerConfig:
    """One validated entry of `AgentProfile.mcp_servers`."""

    name: str
    key: ServerKey
    timeout: float

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ServerConfig:
        name, command = raw.get("name"), raw.get("command")
        args, env = raw.get("args", []), raw.get("env", {})
        timeout = raw.get("timeout", DEFAULT_CALL_TIMEOUT)
        if not isinstance(name, str) or not _SERVER_NAME.match(name):
            raise ValueError(f"MCP server name {name!r} must be 1-64 letters, digits, '_' or '-'")
        if not isinstance(command, str) or not command:
            raise ValueError(f"MCP server {name!r}: command must be a non-empty string")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"MCP server {name!r}: args must be a list of strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError(f"MCP server {name!r}: env must map strings to strings")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_CALL_TIMEOUT:
            raise ValueError(f"MCP server {name!r}: timeout must be a number of seconds in (0, {MAX_CALL_TIMEOUT:g}]")
        key = ServerKey(command, tuple(args), tuple(sorted(env.items())))
        return cls(name=name, key=key, timeout=float(timeout))


Config = ServerConfig | Mapping[str, Any]


def _config(config: Config) -> ServerConfig:
    return config if isinstance(config, ServerConfig) else ServerConfig.parse(config)


class _EofWatch:
    """A read stream that reports when the server's stdout ends.

    The SDK does not expose its subprocess, and stdout EOF is the first thing
    the client side sees when a server dies; noting it lets the next call start
    a fresh server instead of failing on the dead one.
    """

    def __init__(self, inner: Any, on_eof: Callable[[], None]) -> None:
        self._inner = inner
        self._on_eof = on_eof

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_eof()
            raise
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None


_devnull: TextIO | None = None


def _errlog() -> TextIO:
    """Where server stderr goes: ours, unless ours is not a real file (as
    under some test runners), since the child needs a file descriptor."""
    global _devnull
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        if _devnull is None:
            _devnull = open(os.devnull, "w")  # lives as long as the process
        return _devnull
    return sys.stderr


@contextlib.asynccontextmanager
async def _watched_stdio(params: StdioServerParameters, on_eof: Callable[[], None]) -> AsyncIterator[Any]:
    async with stdio_client(params, errlog=_errlog()) as (read_stream, write_stream):
        yield _EofWatch(read_stream, on_eof), write_stream


class _Connection:
    """One server process and its client session, owned by one task on the
    manager's loop (the SDK's task groups must be entered and left by the
    same task)."""

    def __init__(self, key: ServerKey) -> None:
        self.key = key
        self.client: Client | None = None
        self.dead = False
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Client:
        self._task = asyncio.get_running_loop().create_task(self._serve(), name=f"mcp {self.key.label}")
        await self._ready.wait()
        if self.client is None:
            raise MCPUnavailable(f"MCP server {self.key.label!r} could not start: {_describe(self._error)}")
        return self.client

    def _on_eof(self) -> None:
        if not self._stop.is_set():
            logger.warning("MCP server %r exited; it restarts on the next call", self.key.label)
        self.dead = True
        self._stop.set()

    async def _serve(self) -> None:
        transport: Transport = _watched_stdio(self.key.parameters(), self._on_eof)
        try:
            # The client-wide read timeout bounds the handshake; calls pass their own.
            async with Client(transport, read_timeout_seconds=STARTUP_TIMEOUT) as client:
                self.client = client
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:
            self._error = exc
            logger.warning("MCP server %r stopped: %s", self.key.label, _describe(exc))
        finally:
            self.dead = True
            self.client = None
            self._ready.set()

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._task), _SHUTDOWN_TIMEOUT)


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "it exited during startup"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__


class MCPManager:
    """Owns the background loop and every server session of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        # Below: loop-thread only.
        self._connections: dict[ServerKey, _Connection] = {}
        self._start_locks: dict[ServerKey, asyncio.Lock] = {}
        self._tools: dict[ServerKey, list[Tool]] = {}
        self._start_failures: dict[ServerKey, tuple[float, str]] = {}

    # -- sync API -------------------------------------------------------

    def list_tools(self, config: Config) -> list[Definition]:
        cfg = _config(config)
        tools = self._run(self._list_tools(cfg.key), STARTUP_TIMEOUT * 2)
        return [_definition(self, cfg, tool) for tool in tools]

    def call_tool(
        self,
        config: Config,
        tool: str,
        args: dict[str, Any],
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> str:
        cfg = _config(config)
        limit = cfg.timeout if timeout is None else timeout
        return self._run(self._call_tool(cfg.key, tool, args, limit, meta), limit + STARTUP_TIMEOUT)

    def is_running(self, config: Config) -> bool:
        """Whether a live session exists for this config (for tests and health checks)."""
        key = _config(config).key
        return self._run(self._is_running(key), _WAIT_SLACK)

    def shutdown(self) -> None:
        """Stop every server and the loop; the manager can start again later."""
        with self._lock:
            if self._pid != os.getpid():
                self._forget()
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._close_all(), loop)
        with contextlib.suppress(Exception):
            future.result(_SHUTDOWN_TIMEOUT + _WAIT_SLACK)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_WAIT_SLACK)

    # -- loop plumbing --------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():
                self._forget()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=self._run_loop, args=(loop,), name="terret-mcp", daemon=True)
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    def _forget(self) -> None:
        # A forked child inherits this state but not the loop thread (nor, in
        # any useful sense, the server pipes): it starts afresh on first use.
        self._loop = self._thread = None
        self._connections, self._start_locks, self._tools, self._start_failures = {}, {}, {}, {}

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _run(self, coro: Coroutine[Any, Any, T], wait: float) -> T:
        loop = self._ensure_loop()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("MCPManager's sync API cannot be called from its own loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(wait + _WAIT_SLACK)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise MCPUnavailable(f"MCP server did not answer within {wait:g}s") from None

    # -- on the loop ----------------------------------------------------

    async def _is_running(self, key: ServerKey) -> bool:
        conn = self._connections.get(key)
        return conn is not None and not conn.dead and conn.client is not None

    async def _client(self, key: ServerKey) -> tuple[_Connection, Client]:
        lock = self._start_locks.setdefault(key, asyncio.Lock())
        async with lock:
            conn = self._connections.get(key)
            if conn is not None and not conn.dead and conn.client is not None:
                return conn, conn.client
            if conn is not None:
                logger.info("MCP server %r is gone; starting it again", key.label)
                self._tools.pop(key, None)
                await conn.close()
            return await self._start(key)

    async def _start(self, key: ServerKey) -> tuple[_Connection, Client]:
        now = time.monotonic()
        failed = self._start_failures.get(key)
        if failed is not None and now - failed[0] < START_BACKOFF:
            raise MCPUnavailable(failed[1])
        conn = _Connection(key)
        try:
            client = await conn.start()
        except MCPUnavailable as exc:
            self._start_failures[key] = (now, str(exc))
            raise
        self._start_failures.pop(key, None)
        self._connections[key] = conn
        return conn, client

    async def _list_tools(self, key: ServerKey) -> list[Tool]:
        if key in self._tools:
            return self._tools[key]
        # Listing has no side effects, so one retry over a fresh server is safe.
        conn, client = await self._client(key)
        try:
            tools = await _list_all(client)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise _unlistable(key, exc.message) from exc
            conn.dead = True
            conn, client = await self._client(key)
            try:
                tools = await _list_all(client)
            except Exception as again:
                raise _unlistable(key, _describe(again)) from again
        except Exception as exc:  # a malformed listing, a broken pipe: the server is unusable
            raise _unlistable(key, _describe(exc)) from exc
        self._tools[key] = tools
        return tools

    async def _call_tool(
        self,
        key: ServerKey,
        tool: str,
        args: dict[str, Any],
        read_timeout: float,
        meta: Mapping[str, Any] | None = None,
    ) -> str:
        conn, client = await self._client(key)
        # RequestParamsMeta is an open TypedDict (extra_items), which mypy does not model.
        request_meta = cast(RequestParamsMeta, dict(meta)) if meta else None
        try:
            result = await client.call_tool(tool, args, read_timeout_seconds=read_timeout, meta=request_meta)
        except MCPError as exc:
            raise _call_error(conn, tool, read_timeout, exc) from exc
        except ValidationError as exc:
            raise ToolError(f"MCP tool {tool!r} returned a malformed result") from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            conn.dead = True
            raise _exited(tool) from exc
        text = _result_text(result)
        if result.is_error:
            raise ToolError(text or f"MCP tool {tool!r} failed")
        return text

    async def _close_all(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        self._tools.clear()
        await asyncio.gather(*(conn.close() for conn in connections), return_exceptions=True)


def _call_error(conn: _Connection, tool: str, timeout: float, exc: MCPError) -> ToolError:
    if exc.code == REQUEST_TIMEOUT:
        return ToolError(f"MCP tool {tool!r} timed out after {timeout:g}s")
    if exc.code == CONNECTION_CLOSED:
        # Not retried here: the server may have died while running the call,
        # and re-running it is the turn loop's decision, not the transport's.
        conn.dead = True
        return _exited(tool)
    return ToolError(f"MCP error calling {tool!r}: {exc.message}")


def _unlistable(key: ServerKey, reason: str) -> MCPUnavailable:
    return MCPUnavailable(f"MCP server {key.label!r} could not list its tools: {reason}")


def _exited(tool: str) -> MCPUnavailable:
    return MCPUnavailable(f"MCP server exited during the call to {tool!r}; it restarts on the next call")


async def _list_all(client: Client) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(100):  # a server that paginates forever must not hang us
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _result_text(result: CallToolResult) -> str:
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _block_text(block: ContentBlock) -> str:
    if isinstance(block, TextContent):
        return block.text
    mime = getattr(block, "mime_type", None)
    return f"[{block.type} content{f' ({mime})' if mime else ''} omitted]"


def ledger_meta(ctx: ToolContext) -> dict[str, Any] | None:
    """The request `_meta` that tells the server which call (and attempt)
    this is; None outside a turn, where the context has no key."""
    if not ctx.idempotency_key:
        return None
    return {META_IDEMPOTENCY_KEY: ctx.idempotency_key, META_ATTEMPT: ctx.attempt, META_FENCE: ctx.fence}


def _definition(manager: MCPManager, cfg: ServerConfig, tool: Tool) -> Definition:
    hints = tool.annotations
    # The policy from the server's hints. Only `readOnlyHint: true` makes a
    # tool harmless: not mutating, idempotent, replay `safe`, never asked.
    # Anything else, no annotations at all included (MCP's defaults: it may
    # change things and is not idempotent), is mutating, so the `policy`
    # approval mode asks a human. Its replay: `never` with `destructiveHint:
    # true` (destructive wins over idempotent), else `safe` with
    # `idempotentHint: true`, else `never`.
    mutating = hints is None or hints.read_only_hint is not True
    idempotent = not mutating or (hints is not None and hints.idempotent_hint is True)
    destructive = mutating and hints is not None and hints.destructive_hint is True
    replay: Replay = "safe" if idempotent and not destructive else "never"
    remote_name = tool.name

    def handler(ctx: ToolContext, args: dict[str, Any]) -> str:
        return manager.call_tool(cfg, remote_name, args, meta=ledger_meta(ctx))

    return Definition(
        name=f"mcp.{cfg.name}.{tool.name}",
        description=tool.description or tool.title or tool.name,
        parameters=tool.input_schema,
        handler=handler,
        approval="policy" if mutating else "never",
        mutating=mutating,
        idempotent=idempotent,
        replay=replay,
    )


# -- the process-wide manager ---------------------------------------------

_manager: MCPManager | None = None
_manager_lock = threading.Lock()


def manager() -> MCPManager:
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = MCPManager()
        return _manager


def list_tools(config: Config) -> list[Definition]:
    """The server's tools as Definitions named `mcp.<server>.<tool>`."""
    return manager().list_tools(config)


def call_tool(
    config: Config,
    tool: str,
    args: dict[str, Any],
    timeout: float | None = None,
    meta: Mapping[str, Any] | None = None,
) -> str:
    """Call `tool` (its name on the server) and return its text content;
    `meta` goes in the request's `_meta` (see `ledger_meta`)."""
    return manager().call_tool(config, tool, args, timeout, meta)


def shutdown() -> None:
    with _manager_lock:
        current = _manager
    if current is not None:
        current.shutdown()


atexit.register(shutdown)
