"""Browser-test fixtures: a real daphne process serving the app against the
pytest test database, and Debian's headless Chromium driven by Playwright.

Turns run in a real Celery worker process (the `start_worker` fixture) or, for
the embedded-mode variant, in daphne's own in-process worker pool. Nothing is
patched: the page under test talks to exactly what production runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
DAPHNE = ROOT / ".venv" / "bin" / "daphne"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEMO_PROFILE = {
    "description": "Built-in tools: clock and a sandboxed workspace. Writing a file asks for approval.",
    "roles": {},
    "builtin_tools": ["clock.now", "workspace.list", "workspace.read", "workspace.write"],
    "allow_floor": ["clock.*", "workspace.*"],
    "compaction_budget": 100_000,
}


class DaphneServer:
    """`daphne terret_site.asgi:application` as a separate OS process."""

    def __init__(self, env: dict[str, str], port: int | None = None) -> None:
        self.env = env
        self.port = port or free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="terret-daphne-", suffix=".log", delete=False)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def start(self, timeout: float = 60.0) -> DaphneServer:
        cmd = [str(DAPHNE), "-b", "127.0.0.1", "-p", str(self.port), "terret_site.asgi:application"]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/accounts/login/", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"daphne not serving after {timeout}s:\n{self.output()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to close its sockets cleanly."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> DaphneServer:
        self.kill()
        return self.start()


@pytest.fixture
def demo_profile(transactional_db: None) -> Any:
    """The migration's demo profile (a flush by an earlier transactional test removes it)."""
    from sessions_app.models import AgentProfile

    profile, _ = AgentProfile.objects.get_or_create(name="demo", defaults=DEMO_PROFILE)
    return profile


@pytest.fixture
def server_env(transactional_db: None, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """Environment for app processes: the test database, the test Redis, fast demo model."""
    from tests.workers import worker_env

    def make(**overrides: Any) -> dict[str, str]:
        base: dict[str, Any] = {
            "TERRET_DEMO_DELAY": "0.01",
            "TERRET_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
            "LOG_LEVEL": "WARNING",
        }
        base.update(overrides)
        return worker_env(**base)

    return make


@pytest.fixture
def start_server(server_env: Callable[..., dict[str, str]]) -> Iterator[Callable[..., DaphneServer]]:
    """`start_server(**env_overrides)`: a daphne process, killed at teardown (before the flush)."""
    started: list[DaphneServer] = []

    def start(**overrides: Any) -> DaphneServer:
        server = DaphneServer(server_env(**overrides))
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop on this thread; the test's own
    # ORM calls are still plain synchronous code.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def new_page(browser: Any) -> Iterator[Callable[..., Any]]:
    """`new_page(server, user)`: a fresh browser context signed in as `user`."""
    contexts: list[Any] = []

    def make(server: DaphneServer, user: Any | None = None, *, width: int = 1000, js: bool = True) -> Any:
        ctx = browser.new_context(base_url=server.url, viewport={"width": width, "height": 800}, java_script_enabled=js)
        ctx.set_default_timeout(20_000)
        contexts.append(ctx)
        if user is not None:
            ctx.add_cookies([{"name": "sessionid", "value": session_cookie(user), "url": server.url}])
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.js_errors = errors  # asserted empty by the tests
        return page

    yield make
    for ctx in contexts:
        ctx.close()


def session_cookie(user: Any) -> str:
    from django.test import Client

    c = Client()
    c.force_login(user)
    return str(c.cookies["sessionid"].value)


def rendered_events(page: Any) -> list[tuple[int, str]]:
    """(seq, kind) of every event element in the log, in DOM order."""
    rows = page.eval_on_selector_all("#log > li.ev", "els => els.map(e => [Number(e.dataset.seq), e.dataset.kind])")
    return [(int(s), str(k)) for s, k in rows]


def logged_events(session_id: Any) -> list[tuple[int, str]]:
    from sessions_app.models import Event

    return list(Event.objects.filter(session_id=session_id).order_by("seq").values_list("seq", "kind"))


def assert_in_sync(page: Any, session_id: Any, timeout: float = 10.0) -> list[tuple[int, str]]:
    """Wait until the page shows exactly the committed log (listeners such as
    the titler may still be appending), then check it: every event once, in order."""
    deadline = time.monotonic() + timeout
    while True:
        shown, logged = rendered_events(page), logged_events(session_id)
        if shown == logged or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    seqs = [seq for seq, _ in shown]
    assert len(seqs) == len(set(seqs)), f"an event is shown twice: {seqs}"
    assert seqs == sorted(seqs), f"events out of order: {seqs}"
    assert shown == logged
    return shown
