"""A real daphne process serving terret_site.asgi for tests, pointed at the
pytest test database and Redis (the same environment as tests/workers.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import free_port
from tests.workers import ROOT, worker_env


class DaphneProcess:
    def __init__(self, *, port: int | None = None, **env: Any) -> None:
        self.port = port or free_port()
        self.env = {"TERRET_WORKER": "manual", **env}
        self.log = tempfile.NamedTemporaryFile(prefix="terret-daphne-", suffix=".log", delete=False)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def start(self, timeout: float = 60.0) -> DaphneProcess:
        cmd = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "terret_site.asgi:application"]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=worker_env(**self.env), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                if httpx.get(f"{self.http}/api/openapi.json", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"daphne not serving after {timeout}s:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        """SIGTERM (daphne closes its sockets), then SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
