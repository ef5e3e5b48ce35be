"""Real Celery worker processes for tests.

`start_worker()` (fixture in tests/conftest.py) launches
`python -m terret_site.worker --pool threads` (the Procfile's worker) as a separate OS process pointed
at the pytest test database and the test Redis, so durability tests exercise
exactly what production runs. `.kill()` sends SIGKILL: no cleanup code runs;
`.pause()`/`.resume()` send SIGSTOP/SIGCONT and `.terminate()` SIGTERM
(Celery's warm shutdown). Workers get short lease settings unless a test
passes `**DEFAULT_LEASES` (the production defaults).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

# Overrides for worker_env that leave the lease settings at their production
# defaults (an empty value means the default: terret_site/env.py).
DEFAULT_LEASES = {"TERRET_LEASE_SECONDS": "", "TERRET_SWEEP_SECONDS": "", "TERRET_LIVENESS_POLL_SECONDS": ""}


def test_database_url() -> str:
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        raise RuntimeError("worker processes need the Postgres test database")
    user = s.get("USER") or "root"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


def worker_env(**overrides: Any) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": test_database_url(),
            "REDIS_URL": settings.REDIS_URL or "",
            "TERRET_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
            "TERRET_CHANNEL_PREFIX": settings.CHANNEL_PREFIX,
            "TERRET_WORKER": "celery",
            "TERRET_LEASE_SECONDS": "2",
            "TERRET_SWEEP_SECONDS": "0.5",
            "TERRET_DB_POOL_MAX": "10",
            "TERRET_DEMO_DELAY": "0",
            "TERRET_LLM_BASE_URL": settings.TERRET_LLM_BASE_URL or "",
            "TERRET_LLM_API_KEY": settings.TERRET_LLM_API_KEY or "",
            "TERRET_WORKSPACE_ROOT": str(settings.TERRET_WORKSPACE_ROOT),
            "SECRET_KEY": settings.SECRET_KEY,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("TERRET_TESTING", None)
    env.update({k: str(v) for k, v in overrides.items()})
    return env


class WorkerProcess:
    # Celery's optional start-up steps, off in tests unless a test passes `flags` of its own.
    FLAGS = ("--without-gossip", "--without-mingle", "--without-heartbeat")

    # The Procfile's launcher, or (celery_cli=True) Celery's own command line, as a deploy may start one.
    LAUNCHER = ("-m", "terret_site.worker")
    CELERY_CLI = ("-m", "celery", "-A", "terret_site", "worker")

    def __init__(
        self,
        *,
        concurrency: int = 8,
        name: str = "w",
        flags: tuple[str, ...] = FLAGS,
        celery_cli: bool = False,
        **env: Any,
    ) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix=f"terret-worker-{name}-", suffix=".log", delete=False)
        queue = env.get("TERRET_QUEUE", settings.CELERY_TASK_DEFAULT_QUEUE)
        cmd = [
            sys.executable, *(self.CELERY_CLI if celery_cli else self.LAUNCHER),
            "--pool", "threads", "--concurrency", str(concurrency), "-Q", str(queue),
            "-n", f"{name}-{os.getpid()}-{time.monotonic_ns()}@%h",
            *flags, "-l", "INFO",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=worker_env(**env), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            if " ready." in self.output():
                return self
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready after {timeout}s:\n{self.output()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL the whole process group: nothing gets to clean up."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the process freezes with its sockets (and its liveness lock) held."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM, as a deploy sends it (Celery's warm shutdown); does not wait."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_exit(self, timeout: float = 30.0) -> int:
        """The exit code, once the process has exited."""
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def purge_queue() -> None:
    from terret_site.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(settings.CELERY_TASK_DEFAULT_QUEUE)
