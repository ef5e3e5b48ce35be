"""Real MCP servers for the tool tests, installed by the project's own files:
the npm fixtures in tests/mcp_fixtures (package.json + package-lock.json,
`npm ci` in .ci/run) and mcp-server-git from requirements-dev.txt.

- `everything_stdio`: @modelcontextprotocol/server-everything over stdio;
- `everything_http`: the same server over Streamable HTTP on a loopback port,
  reached through `auth_proxy`, which answers 401 unless the request carries
  `Authorization: Bearer <TOKEN>` and records every Authorization it saw;
- `filesystem_server(root)`: @modelcontextprotocol/server-filesystem;
- `filesystem_workspace`: the same, working in each session's documents
  (`"workspace": true`, its allowed directory `{workspace}`);
- `git_server`: mcp-server-git (PyPI).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessions_app.tools import mcp

FIXTURES = Path(__file__).resolve().parents[2] / "mcp_fixtures"
MODULES = FIXTURES / "node_modules"
EVERYTHING = MODULES / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
FILESYSTEM = MODULES / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
CONFORMANCE = MODULES / ".bin" / "conformance"
TOKEN_VAR = "TERRET_TEST_MCP_TOKEN"


def node() -> str:
    path = shutil.which("node")
    assert path, "these tests need Node (20 is on the machine)"
    return path


def need(path: Path) -> Path:
    assert path.exists(), f"{path} is missing: run `npm ci --prefix {FIXTURES}` (.ci/run does)"
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port}")


@pytest.fixture(scope="module", autouse=True)
def stop_mcp_servers() -> Iterator[None]:
    yield
    mcp.shutdown()


@pytest.fixture(scope="module")
def everything_stdio() -> dict[str, Any]:
    return {"name": "everything", "command": node(), "args": [str(need(EVERYTHING)), "stdio"]}


class EverythingHttp:
    """server-everything's Streamable HTTP transport as its own process."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> EverythingHttp:
        env = {**os.environ, "PORT": str(self.port)}
        self.proc = subprocess.Popen(
            [node(), str(need(EVERYTHING)), "streamableHttp"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class AuthProxy(ThreadingHTTPServer):
    """A bearer-token gate in front of a server: 401 without the token,
    otherwise the request goes through unchanged and the answer streams back
    (SSE included, delimited by the connection's close)."""

    daemon_threads = True

    def __init__(self, upstream: str, token: str) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream, self.token = upstream, token
        self.seen: list[str] = []  # every Authorization header received, in order
        self.refused = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/mcp"


class _ProxyHandler(BaseHTTPRequestHandler):
    server: AuthProxy
    protocol_version = "HTTP/1.0"  # one request per connection: bodies end at the close

    def log_message(self, *args: Any) -> None:
        return

    def _forward(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.server.seen.append(auth)
        if auth != f"Bearer {self.server.token}":
            self.server.refused += 1
            self.send_response(401)
            self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        skip = {"host", "content-length", "connection", "authorization"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        with httpx.Client(timeout=None) as client:
            with client.stream(self.command, self.server.upstream + self.path, headers=headers, content=body) as up:
                self.send_response(up.status_code)
                for key, value in up.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.end_headers()
                try:
                    for chunk in up.iter_raw():
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return

    do_GET = do_POST = do_DELETE = _forward


@pytest.fixture
def everything_http() -> Iterator[EverythingHttp]:
    server = EverythingHttp().start()
    yield server
    server.stop()


@pytest.fixture
def auth_proxy(everything_http: EverythingHttp, monkeypatch: pytest.MonkeyPatch) -> Iterator[AuthProxy]:
    """The gate in front of server-everything; the token is in the
    environment (TERRET_TEST_MCP_TOKEN), where profiles' headers read it."""
    token = "tok-" + os.urandom(8).hex()
    monkeypatch.setenv(TOKEN_VAR, token)
    proxy = AuthProxy(f"http://127.0.0.1:{everything_http.port}", token)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    yield proxy
    proxy.shutdown()
    proxy.server_close()


def http_config(proxy: AuthProxy, name: str = "remote") -> dict[str, Any]:
    return {"name": name, "url": proxy.url, "headers": {"Authorization": f"Bearer ${{{TOKEN_VAR}}}"}}


@pytest.fixture
def filesystem_server(tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "shared"
    root.mkdir()
    return {"name": "fs", "command": node(), "args": [str(need(FILESYSTEM)), str(root)]}


def filesystem_workspace_config(name: str = "fs") -> dict[str, Any]:
    return {"name": name, "command": node(), "args": [str(need(FILESYSTEM)), "{workspace}"], "workspace": True}


@pytest.fixture
def filesystem_workspace() -> dict[str, Any]:
    return filesystem_workspace_config()


@pytest.fixture
def git_server(tmp_path: Path) -> dict[str, Any]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=Terret", "-c", "user.email=terret@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "README").write_text("hello\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    env = {
        "GIT_AUTHOR_NAME": "Terret",
        "GIT_AUTHOR_EMAIL": "terret@example.invalid",
        "GIT_COMMITTER_NAME": "Terret",
        "GIT_COMMITTER_EMAIL": "terret@example.invalid",
    }
    return {
        "name": "git",
        "command": sys.executable,
        "args": ["-m", "mcp_server_git", "--repository", str(repo)],
        "env": env,
    }
