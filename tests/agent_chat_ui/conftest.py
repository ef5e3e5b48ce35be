"""agent-chat-ui (LangGraph's own chat UI, pinned in app/, README.md) as a
fixture: its production build served by `next start` on a loopback port.

The build is made by .ci/run (`pnpm install --frozen-lockfile`, `next
build`); the tests never build. Without a build the tests skip loudly; in CI
(TERRET_NO_SKIP=1) a missing build fails them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port

APP = Path(__file__).resolve().parent / "app"
NEXT = APP / "node_modules" / "next" / "dist" / "bin" / "next"
BUILD_ID = APP / ".next" / "BUILD_ID"


class ChatUI:
    """`next start` as a separate OS process (its own process group)."""

    def __init__(self, node: str) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="terret-agent-chat-ui-", suffix=".log", delete=False)
        cmd = [node, str(NEXT), "start", "-H", "127.0.0.1", "-p", str(self.port)]
        env = {**os.environ, "NEXT_TELEMETRY_DISABLED": "1", "NODE_ENV": "production"}
        self.proc = subprocess.Popen(
            cmd, cwd=APP, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def wait(self, timeout: float = 60.0) -> ChatUI:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"next start exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"agent-chat-ui not serving after {timeout}s:\n{self.output()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("TERRET_NO_SKIP") == "1":
        pytest.fail(f"TERRET_NO_SKIP=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chat_ui() -> Iterator[ChatUI]:
    node = shutil.which("node")
    if node is None:
        _skip_or_fail("agent-chat-ui needs node (Node 20+)")
    if not BUILD_ID.is_file():
        _skip_or_fail(
            "agent-chat-ui is not built: cd tests/agent_chat_ui/app && npx pnpm@10.5.1 install --frozen-lockfile"
            " && npx pnpm@10.5.1 run build (.ci/run does)"
        )
    assert node is not None
    ui = ChatUI(node)
    try:
        yield ui.wait()
    finally:
        ui.stop()
