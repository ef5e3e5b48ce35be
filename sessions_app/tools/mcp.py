"""MCP servers, over stdio or Streamable HTTP, reached through the official
`mcp` SDK (2.x).

The SDK is async and its client sessions are bound to the event loop and task
that opened them, while Terret's turn loop runs in plain worker threads. So one
per-process manager owns a background event loop thread; each distinct server
config (command, args, env) gets one long-lived client session on that loop,
started on first use. Sync callers hand coroutines to the loop with
`asyncio.run_coroutine_threadsafe` and wait for the answer. Every piece of
manager state is touched only on the loop thread, which is what makes the
manager safe to call from many worker threads at once.

A remote (Streamable HTTP) server's headers are templates: `${VAR}` is
replaced from the worker's environment when the connection opens, so a
secret lives in the environment only, never in the profile, the log or an
error message. A tool call's progress notifications go to the call's
progress sink (the runtime turns them into live hints); its result keeps
images as attachments beside the text (llm.types.ToolText).

A stdio server with `"workspace": true` works in the session's documents
(docs/documents.md): each session gets its own scratch directory of them
(tools/documents.directory, runtime/materialize.py) and its own server
process, `{workspace}` in its args and env values naming that directory,
which is also its cwd. Before each call the directory is brought to the
documents' heads; after it, what changed is committed back as document
versions by `mcp:<server>`, fenced on the call's lease. Such a server's tools
are listed from an instance over an empty directory that no call reaches.
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
import shutil
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TextIO, TypeVar, cast

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.message import SessionMessage
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    REQUEST_TIMEOUT,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    RequestParamsMeta,
    ResourceLink,
    TextContent,
    TextResourceContents,
    Tool,
)
from pydantic import ValidationError

from sessions_app.llm.types import ToolText

from . import documents
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
# A remote server's HTTP timeouts: connecting, and the longest silence on a
# response stream (a long call's stream may be quiet; the call's own timeout
# is the SDK's read timeout, below this).
HTTP_CONNECT_TIMEOUT = 30.0
HTTP_READ_TIMEOUT = MAX_CALL_TIMEOUT + 60.0
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_STRAY_PLACEHOLDER = re.compile(r"\$\{")
# Headers that carry credentials: their value must come from the environment.
_SECRET_HEADERS = re.compile(r"(authorization|cookie|token|secret|key|auth|password|session)", re.IGNORECASE)
# In a workspace server's args and env values: its session's scratch directory.
WORKSPACE = "{workspace}"
# Each workspace (a session's server process and directory) this process
# keeps is closed when idle this long, or when more than MAX_WORKSPACES are
# open (the least recently used first); the next call makes it again.
MAX_WORKSPACES = 8
WORKSPACE_IDLE_SECONDS = 600.0
# Progress notifications are forwarded at most this often per call (the last
# one, progress == total, always), so a chatty server cannot flood sockets.
PROGRESS_INTERVAL = 0.1

# What a call's progress is reported to: (progress, total, message).
ProgressFn = Callable[[float, float | None, str | None], None]
# What a registry gives a server's tools to report progress with: the call's
# context and one notification, as a `tool/progress` hint payload.
ProgressSink = Callable[[ToolContext, dict[str, Any]], None]


class MCPUnavailable(ToolError):
    """The MCP server could not be started or stopped answering."""


class MCPConfigError(ValueError):
    """A server's configuration cannot be used in this process (a header
    names an environment variable that is not set). A ValueError, as every
    configuration mistake is: it fails the turn with its message rather than
    leaving the server's tools out."""


@dataclass(frozen=True)
class ServerKey:
    """What identifies one server process: profiles with the same command,
    args and env share it, whatever they call it."""

    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str = ""

    @property
    def label(self) -> str:
        """For logs and messages; env is left out since it may hold secrets."""
        text = " ".join([self.command, *self.args])
        return text if len(text) <= 120 else text[:117] + "..."

    @property
    def names_workspace(self) -> bool:
        return any(WORKSPACE in a for a in self.args) or any(WORKSPACE in v for _, v in self.env)

    def at(self, directory: Path) -> ServerKey:
        """This server run in `directory`: `{workspace}` replaced by it, its cwd."""
        where = str(directory)
        args = tuple(a.replace(WORKSPACE, where) for a in self.args)
        env = tuple((k, v.replace(WORKSPACE, where)) for k, v in self.env)
        return ServerKey(self.command, args, env, cwd=where)

    def parameters(self) -> StdioServerParameters:
        return StdioServerParameters(
            command=self.command, args=list(self.args), env=dict(self.env) or None, cwd=self.cwd or None
        )


@dataclass(frozen=True)
class HttpKey:
    """A remote server reached over Streamable HTTP: its URL and its header
    templates (`${VAR}` placeholders, resolved at connect time)."""

    url: str
    headers: tuple[tuple[str, str], ...]
    server: str = ""  # the profile's name for it, for error messages only

    @property
    def label(self) -> str:
        """The URL without credentials or query (neither belongs in a log)."""
        parts = httpx2.URL(self.url)
        return f"{parts.scheme}://{parts.host}{f':{parts.port}' if parts.port else ''}{parts.path}"

    def resolved_headers(self) -> dict[str, str]:
        """The headers with every `${VAR}` replaced from the environment; an
        unset variable is a configuration error naming it (never its value)."""
        resolved = {}
        for header, template in self.headers:
            missing = [v for v in _PLACEHOLDER.findall(template) if v not in os.environ]
            if missing:
                raise MCPConfigError(
                    f"MCP server {self.server!r}: header {header!r} needs the environment variable "
                    f"{missing[0]}, which is not set in this worker's environment"
                )
            resolved[header] = _PLACEHOLDER.sub(lambda m: os.environ[m.group(1)], template)
        return resolved


Key = ServerKey | HttpKey


@dataclass(frozen=True)
class ServerConfig:
    """One validated entry of `AgentProfile.mcp_servers`: a stdio server
    (`command`) or a remote one (`url`)."""

    name: str
    key: Key
    timeout: float
    workspace: bool = False  # it works in the session's documents (a stdio server only)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ServerConfig:
        name = raw.get("name")
        timeout = raw.get("timeout", DEFAULT_CALL_TIMEOUT)
        workspace = raw.get("workspace", False)
        if not isinstance(name, str) or not _SERVER_NAME.match(name):
            raise ValueError(f"MCP server name {name!r} must be 1-64 letters, digits, '_' or '-'")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_CALL_TIMEOUT:
            raise ValueError(f"MCP server {name!r}: timeout must be a number of seconds in (0, {MAX_CALL_TIMEOUT:g}]")
        if not isinstance(workspace, bool):
            raise ValueError(f"MCP server {name!r}: workspace must be true or false")
        if "url" in raw and "command" in raw:
            raise ValueError(f"MCP server {name!r}: give either a command (stdio) or a url (Streamable HTTP), not both")
        if workspace and "url" in raw:
            raise ValueError(
                f"MCP server {name!r}: workspace applies to a stdio server only (a process run beside the "
                "session's documents), not to a url"
            )
        key = _http_key(name, raw) if "url" in raw else _stdio_key(name, raw)
        if not workspace and isinstance(key, ServerKey) and key.names_workspace:
            raise ValueError(
                f'MCP server {name!r}: its args or env name {WORKSPACE}, which only a server with "workspace": true '
                "is given"
            )
        return cls(name=name, key=key, timeout=float(timeout), workspace=workspace)


def _stdio_key(name: str, raw: Mapping[str, Any]) -> ServerKey:
    command, args, env = raw.get("command"), raw.get("args", []), raw.get("env", {})
    if "headers" in raw:
        raise ValueError(f"MCP server {name!r}: headers apply to a url server only; a stdio server takes env")
    if not isinstance(command, str) or not command:
        raise ValueError(f"MCP server {name!r}: command must be a non-empty string")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"MCP server {name!r}: args must be a list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"MCP server {name!r}: env must map strings to strings")
    return ServerKey(command, tuple(args), tuple(sorted(env.items())))


def _http_key(name: str, raw: Mapping[str, Any]) -> HttpKey:
    url, headers = raw.get("url"), raw.get("headers", {})
    stray = sorted(k for k in ("command", "args", "env") if k in raw)
    if stray:
        raise ValueError(f"MCP server {name!r}: {', '.join(stray)} apply to a stdio server only, not to a url")
    if not isinstance(url, str):
        raise ValueError(f"MCP server {name!r}: url must be an http:// or https:// URL")
    try:
        parsed: httpx2.URL | None = httpx2.URL(url)
    except Exception:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"MCP server {name!r}: url must be an http:// or https:// URL")
    if parsed.userinfo or any(_SECRET_HEADERS.search(k) for k in parsed.params):
        # The url is stored, shown in the admin and may appear in error messages: no credentials in it.
        raise ValueError(f"MCP server {name!r}: put credentials in headers from the environment, not in the url")
    if not isinstance(headers, dict):
        raise ValueError(f"MCP server {name!r}: headers must map header names to strings")
    for header, value in headers.items():
        _check_header(name, header, value)
    return HttpKey(url, tuple(sorted(headers.items())), server=name)


def _check_header(name: str, header: Any, value: Any) -> None:
    if not isinstance(header, str) or not _HEADER_NAME.match(header):
        raise ValueError(f"MCP server {name!r}: {header!r} is not a valid header name")
    if not isinstance(value, str) or "\n" in value or "\r" in value:
        raise ValueError(f"MCP server {name!r}: header {header!r} must be a one-line string")
    if _STRAY_PLACEHOLDER.search(_PLACEHOLDER.sub("", value)):
        raise ValueError(f"MCP server {name!r}: header {header!r} has a malformed placeholder; write ${{NAME}}")
    if _SECRET_HEADERS.search(header) and not _PLACEHOLDER.search(value):
        # The profile is stored in the database and shown in the admin: a
        # credential written into it would be a secret in the wrong place.
        raise ValueError(
            f"MCP server {name!r}: header {header!r} carries a credential, so its value must come from the "
            f'environment, e.g. "Bearer ${{MCP_TOKEN}}"'
        )


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


@contextlib.asynccontextmanager
async def _remote(key: HttpKey, headers: dict[str, str], on_eof: Callable[[], None]) -> AsyncIterator[Any]:
    """A Streamable HTTP connection with the resolved headers on every request
    (the POSTs, the GET stream, the DELETE at close)."""
    timeout = httpx2.Timeout(HTTP_CONNECT_TIMEOUT, read=HTTP_READ_TIMEOUT)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with streamable_http_client(key.url, http_client=http) as (read_stream, write_stream):
            yield _EofWatch(read_stream, on_eof), write_stream


def _transport(key: Key, on_eof: Callable[[], None]) -> Transport:
    if isinstance(key, HttpKey):
        return _remote(key, key.resolved_headers(), on_eof)
    return _watched_stdio(key.parameters(), on_eof)


class _Connection:
    """One server process and its client session, owned by one task on the
    manager's loop (the SDK's task groups must be entered and left by the
    same task)."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.client: Client | None = None
        self.dead = False
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Client:
        # Headers are resolved here, before anything starts: an unset variable
        # is the profile's mistake (MCPConfigError), not a server failure.
        transport = _transport(self.key, self._on_eof)
        self._task = asyncio.get_running_loop().create_task(self._serve(transport), name=f"mcp {self.key.label}")
        await self._ready.wait()
        if self.client is None:
            raise MCPUnavailable(f"MCP server {self.key.label!r} could not start: {_describe(self._error)}")
        return self.client

    def _on_eof(self) -> None:
        if not self._stop.is_set():
            logger.warning("MCP server %r exited; it restarts on the next call", self.key.label)
        self.dead = True
        self._stop.set()

    async def _serve(self, transport: Transport) -> None:
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


@dataclass
class _Workspace:
    """One session's directory for one workspace server, and that server run in it."""

    key: ServerKey
    directory: documents.Directory
    lock: threading.Lock = field(default_factory=threading.Lock)  # one call at a time in the directory
    users: int = 0  # calls holding it: never closed under them
    used: float = field(default_factory=time.monotonic)


class MCPManager:
    """Owns the background loop and every server session of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        # Below: loop-thread only.
        self._connections: dict[Key, _Connection] = {}
        self._start_locks: dict[Key, asyncio.Lock] = {}
        self._tools: dict[Key, list[Tool]] = {}
        self._start_failures: dict[Key, tuple[float, str]] = {}
        # Workspace servers (any thread, under their own lock): by session, server name and configured key.
        self._workspaces_lock = threading.Lock()
        self._workspaces: OrderedDict[tuple[uuid.UUID, str, ServerKey], _Workspace] = OrderedDict()
        self._listing_dir: Path | None = None

    # -- sync API -------------------------------------------------------

    def list_tools(self, config: Config, progress: ProgressSink | None = None) -> list[Definition]:
        cfg = _config(config)
        tools = self._run(self._list_tools(self._listing_key(cfg)), STARTUP_TIMEOUT * 2)
        return [_definition(self, cfg, tool, progress) for tool in tools]

    def call_tool(
        self,
        config: Config,
        tool: str,
        args: dict[str, Any],
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
        on_progress: ProgressFn | None = None,
    ) -> ToolText:
        cfg = _config(config)
        if cfg.workspace:
            raise ToolError(
                f"MCP server {cfg.name!r} works in a session's documents: only a tool call of a session's turn uses it"
            )
        limit = cfg.timeout if timeout is None else timeout
        return self._run(self._call_tool(cfg.key, tool, args, limit, meta, on_progress), limit + STARTUP_TIMEOUT)

    def call_in_workspace(
        self,
        config: Config,
        ctx: ToolContext,
        tool: str,
        args: dict[str, Any],
        meta: Mapping[str, Any] | None = None,
        on_progress: ProgressFn | None = None,
    ) -> ToolText:
        """Call a workspace server's `tool` for the session of `ctx`, in its
        directory: brought to the documents' heads first, its changes
        committed after (fenced on `ctx.fence`; LeaseLost propagates, having
        committed nothing). A change that could not be kept (too large, a
        conflict) makes the call an error that names it."""
        cfg = _config(config)
        ws = self._workspace(cfg, ctx.session_id)
        try:
            with ws.lock:
                ws.directory.refresh()
                call = self._call_tool(ws.key, tool, args, cfg.timeout, meta, on_progress)
                try:
                    result = self._run(call, cfg.timeout + STARTUP_TIMEOUT)
                except ToolError as exc:
                    # A failed call may have changed files too: what it left is the session's world.
                    problems = ws.directory.commit(ctx.fence)
                    raise ToolError(_unsaved(str(exc), problems)) from exc
                problems = ws.directory.commit(ctx.fence)
        finally:
            with self._workspaces_lock:
                ws.users -= 1
                ws.used = time.monotonic()
        if problems:
            raise ToolError(_unsaved(str(result), problems))
        return result

    def relist_tools(self, config: Config) -> list[str]:
        """The names the server lists now, asked again (not this process's
        cached listing): a server upgraded in place may have dropped a tool."""
        cfg = _config(config)
        return [tool.name for tool in self._run(self._relist(self._listing_key(cfg)), STARTUP_TIMEOUT * 2)]

    def is_running(self, config: Config) -> bool:
        """Whether a live session exists for this config (for tests and health checks)."""
        key = self._listing_key(_config(config))
        return self._run(self._is_running(key), _WAIT_SLACK)

    def workspace_dirs(self, session_id: uuid.UUID) -> list[Path]:
        """The directories this process keeps for the session's workspace servers (for tests)."""
        with self._workspaces_lock:
            return [ws.directory.path for (sid, _, _), ws in self._workspaces.items() if sid == session_id]

    # -- workspaces -----------------------------------------------------

    def _listing_key(self, cfg: ServerConfig) -> Key:
        """The key a server's tools are listed under: a workspace server's
        over an empty directory of this process's, which no call reaches."""
        if not cfg.workspace or not isinstance(cfg.key, ServerKey):
            return cfg.key
        with self._workspaces_lock:
            if self._listing_dir is None:
                self._listing_dir = documents.empty_directory("mcp-list")
            return cfg.key.at(self._listing_dir)

    def _workspace(self, cfg: ServerConfig, session_id: uuid.UUID) -> _Workspace:
        """The session's workspace for this server, made on first use (its
        directory, and a server process of its own); taken by the caller
        (`users`) until it lets go."""
        assert isinstance(cfg.key, ServerKey)  # parse allows workspace on stdio servers only
        slot = (session_id, cfg.name, cfg.key)
        with self._workspaces_lock:
            ws = self._workspaces.get(slot)
            if ws is not None:
                ws.users += 1
                self._workspaces.move_to_end(slot)
        if ws is None:
            # Materialized outside the lock: it reads every document of the session.
            made = documents.directory(session_id, f"mcp:{cfg.name}")
            with self._workspaces_lock:
                ws = self._workspaces.setdefault(slot, _Workspace(cfg.key.at(made.path), made))
                ws.users += 1
            if ws.directory is not made:  # another thread made it meanwhile
                made.remove()
        self._close_workspaces(self._idle_workspaces())
        return ws

    def close_idle(self) -> int:
        """Close the workspaces idle too long (and any past the bound): a
        worker's clock calls this, so a session nobody calls again does not
        keep its server process and directory for the worker's life."""
        gone = self._idle_workspaces()
        self._close_workspaces(gone)
        return len(gone)

    def _idle_workspaces(self) -> list[_Workspace]:
        """Taken out of the pool: the ones idle too long, and the least
        recently used past MAX_WORKSPACES; none a call holds."""
        now = time.monotonic()
        with self._workspaces_lock:
            free = [slot for slot, ws in self._workspaces.items() if ws.users == 0]
            over = len(self._workspaces) - MAX_WORKSPACES
            gone = []
            for slot in free:  # oldest use first
                if over > 0 or now - self._workspaces[slot].used > WORKSPACE_IDLE_SECONDS:
                    gone.append(self._workspaces.pop(slot))
                    over -= 1
            return gone

    def _close_workspaces(self, gone: list[_Workspace]) -> None:
        for ws in gone:
            with contextlib.suppress(Exception):
                self._run(self._close(ws.key), _SHUTDOWN_TIMEOUT)
            ws.directory.remove()

    def shutdown(self) -> None:
        """Stop every server and the loop; the manager can start again later."""
        with self._lock:
            if self._pid != os.getpid():
                self._forget()
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            self._remove_directories()  # no loop, so no server runs in them
            return
        future = asyncio.run_coroutine_threadsafe(self._close_all(), loop)
        with contextlib.suppress(Exception):
            future.result(_SHUTDOWN_TIMEOUT + _WAIT_SLACK)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_WAIT_SLACK)
        self._remove_directories()

    def _remove_directories(self) -> None:
        """Every workspace directory of this process, and its listing one (the servers are closed)."""
        with self._workspaces_lock:
            gone, self._workspaces = list(self._workspaces.values()), OrderedDict()
            listing, self._listing_dir = self._listing_dir, None
        for ws in gone:
            ws.directory.remove()
        if listing is not None:
            shutil.rmtree(listing, ignore_errors=True)

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
        # The parent's workspace directories are the parent's to remove.
        self._workspaces, self._listing_dir = OrderedDict(), None

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

    async def _is_running(self, key: Key) -> bool:
        conn = self._connections.get(key)
        return conn is not None and not conn.dead and conn.client is not None

    async def _client(self, key: Key) -> tuple[_Connection, Client]:
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

    async def _start(self, key: Key) -> tuple[_Connection, Client]:
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

    async def _list_tools(self, key: Key) -> list[Tool]:
        if key in self._tools:
            return self._tools[key]
        # Listing has no side effects, so one retry over a fresh server is safe.
        conn, client = await self._client(key)
        try:
            tools = await _list_all(client)
        except MCPError as exc:
            if not _gone(exc, key):
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

    async def _relist(self, key: Key) -> list[Tool]:
        self._tools.pop(key, None)
        return await self._list_tools(key)

    async def _call_tool(
        self,
        key: Key,
        tool: str,
        args: dict[str, Any],
        read_timeout: float,
        meta: Mapping[str, Any] | None = None,
        on_progress: ProgressFn | None = None,
    ) -> ToolText:
        conn, client = await self._client(key)
        # RequestParamsMeta is an open TypedDict (extra_items), which mypy does not model.
        request_meta = cast(RequestParamsMeta, dict(meta)) if meta else None
        progress = _progress_callback(on_progress) if on_progress is not None else None
        try:
            result = await client.call_tool(
                tool, args, read_timeout_seconds=read_timeout, progress_callback=progress, meta=request_meta
            )
        except MCPError as exc:
            raise _call_error(conn, tool, read_timeout, exc) from exc
        except ValidationError as exc:
            raise ToolError(f"MCP tool {tool!r} returned a malformed result") from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            conn.dead = True
            raise _exited(tool) from exc
        text = _result(result)
        if result.is_error:
            raise ToolError(str(text) or f"MCP tool {tool!r} failed")
        return text

    async def _close(self, key: Key) -> None:
        conn = self._connections.pop(key, None)
        self._tools.pop(key, None)
        self._start_locks.pop(key, None)
        self._start_failures.pop(key, None)
        if conn is not None:
            await conn.close()

    async def _close_all(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        self._tools.clear()
        await asyncio.gather(*(conn.close() for conn in connections), return_exceptions=True)


def _unsaved(text: str, problems: list[str]) -> str:
    if not problems:
        return text
    said = "\n".join(f"- {p}" for p in problems)
    return f"{text}\n\nChanges to the session's documents not saved (gone before the next call):\n{said}"


def _call_error(conn: _Connection, tool: str, timeout: float, exc: MCPError) -> ToolError:
    if exc.code == REQUEST_TIMEOUT:
        return ToolError(f"MCP tool {tool!r} timed out after {timeout:g}s")
    if _gone(exc, conn.key):
        # Not retried here: the server may have died while running the call,
        # and re-running it is the turn loop's decision, not the transport's.
        conn.dead = True
        return _exited(tool)
    return ToolError(f"MCP error calling {tool!r}: {exc.message}")


def _gone(exc: MCPError, key: Key) -> bool:
    """The connection is no use any more: a stdio server exited, or a remote
    one answered at the HTTP level instead of in JSON-RPC (a restarted server
    that forgot our session says 404, "Session terminated", or, as
    server-everything does, 400; one that is down cannot be reached). The
    next call connects afresh; a spurious reconnect costs one handshake."""
    if exc.code == CONNECTION_CLOSED:
        return True
    return isinstance(key, HttpKey) and (exc.code == INTERNAL_ERROR or exc.message == "Session terminated")


def _progress_callback(report: ProgressFn) -> ProgressFnT:
    """The SDK's async progress callback (run on the manager's loop) around a
    sync reporter, throttled to one report per PROGRESS_INTERVAL (the final
    one, progress == total, always goes through)."""
    last = [0.0]

    async def callback(progress: float, total: float | None, message: str | None) -> None:
        now = time.monotonic()
        if now - last[0] < PROGRESS_INTERVAL and (total is None or progress < total):
            return
        last[0] = now
        try:
            report(progress, total, message)
        except Exception:  # progress is a courtesy; it never breaks the call
            logger.warning("a progress report failed", exc_info=True)

    return callback


def _unlistable(key: Key, reason: str) -> MCPUnavailable:
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


def _result(result: CallToolResult) -> ToolText:
    """The result as text the model reads, images kept as attachments. Every
    block is said in order; an image is a line naming it ("[image 1:
    image/png, 95 bytes]") and its data goes in the attachments. Structured
    content is added as JSON when no text block carries it: the spec asks a
    server to send its serialized form as text too, and most do (some as
    the bare value of a `{"result": ...}` wrapper), so a result with text
    is taken to say it already."""
    parts: list[str] = []
    images: list[dict[str, Any]] = []
    for block in result.content:
        parts.append(_block_text(block, images))
    structured = result.structured_content
    if structured is not None and not any(isinstance(block, TextContent) for block in result.content):
        parts.append("structured content: " + json.dumps(structured, ensure_ascii=False))
    return ToolText("\n".join(parts), images)


def _block_text(block: ContentBlock, images: list[dict[str, Any]]) -> str:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent):
        return _image(block.mime_type, block.data, images)
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}"
        if isinstance(resource, BlobResourceContents) and (resource.mime_type or "").startswith("image/"):
            return _image(resource.mime_type or "image/png", resource.blob, images, f" (resource {resource.uri})")
        blob = resource.blob if isinstance(resource, BlobResourceContents) else ""
        return f"[resource {resource.uri} ({resource.mime_type or 'binary'}, {_b64_size(blob)} bytes) not shown]"
    if isinstance(block, ResourceLink):
        mime = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link: {block.name} {block.uri}{mime}]"
    if isinstance(block, AudioContent):
        return f"[audio ({block.mime_type}, {_b64_size(block.data)} bytes) not shown: Terret passes no audio to models]"
    return f"[{block.type} content omitted]"


def _image(mime: str, data: str, images: list[dict[str, Any]], where: str = "") -> str:
    images.append({"type": "image", "mime_type": mime, "data": data})
    return f"[image {len(images)}: {mime}, {_b64_size(data)} bytes{where}]"


def _b64_size(data: str) -> int:
    """Decoded size of base64 text, without decoding it."""
    return len(data) * 3 // 4 - data[-2:].count("=") if data else 0


def ledger_meta(ctx: ToolContext) -> dict[str, Any] | None:
    """The request `_meta` that tells the server which call (and attempt)
    this is; None outside a turn, where the context has no key."""
    if not ctx.idempotency_key:
        return None
    return {META_IDEMPOTENCY_KEY: ctx.idempotency_key, META_ATTEMPT: ctx.attempt, META_FENCE: ctx.fence}


def _definition(manager: MCPManager, cfg: ServerConfig, tool: Tool, progress: ProgressSink | None = None) -> Definition:
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
        report = _reporter(progress, ctx) if progress is not None else None
        if cfg.workspace:
            return manager.call_in_workspace(cfg, ctx, remote_name, args, meta=ledger_meta(ctx), on_progress=report)
        return manager.call_tool(cfg, remote_name, args, meta=ledger_meta(ctx), on_progress=report)

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


def _reporter(sink: ProgressSink, ctx: ToolContext) -> ProgressFn:
    def report(progress: float, total: float | None, message: str | None) -> None:
        payload: dict[str, Any] = {"kind": "tool/progress", "call_id": ctx.call_id, "progress": progress}
        if total is not None:
            payload["total"] = total
        if message:
            payload["message"] = message[:500]
        sink(ctx, payload)

    return report


# -- the process-wide manager ---------------------------------------------

_manager: MCPManager | None = None
_manager_lock = threading.Lock()


def manager() -> MCPManager:
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = MCPManager()
        return _manager


def close_idle_workspaces() -> int:
    """This process's idle workspaces closed (MCPManager.close_idle); none
    when no manager was ever made here."""
    return _manager.close_idle() if _manager is not None else 0


def list_tools(config: Config, progress: ProgressSink | None = None) -> list[Definition]:
    """The server's tools as Definitions named `mcp.<server>.<tool>`; their
    calls report progress notifications to `progress`."""
    return manager().list_tools(config, progress)


def relist_tools(config: Config) -> list[str]:
    """The tool names (the server's own) the server lists now (MCPUnavailable
    when it cannot be asked)."""
    return manager().relist_tools(config)


def call_tool(
    config: Config,
    tool: str,
    args: dict[str, Any],
    timeout: float | None = None,
    meta: Mapping[str, Any] | None = None,
    on_progress: ProgressFn | None = None,
) -> ToolText:
    """Call `tool` (its name on the server) and return its content as text
    (images in `.attachments`); `meta` goes in the request's `_meta` (see
    `ledger_meta`); progress notifications go to `on_progress`."""
    return manager().call_tool(config, tool, args, timeout, meta, on_progress)


def shutdown() -> None:
    with _manager_lock:
        current = _manager
    if current is not None:
        current.shutdown()


atexit.register(shutdown)
