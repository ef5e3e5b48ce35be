"""A private service stack for tests that break the services themselves.

The machine's PostgreSQL and Redis are shared (other test runs, CI), so a
test that restarts PostgreSQL or stops Redis must bring its own. `Stack`
starts, all on free ports of 127.0.0.1 and under one temporary directory:

- `PrivatePostgres`: a fresh cluster from `initdb` (the newest version under
  /usr/lib/postgresql), run by the `postgres` OS user when we are root
  (initdb refuses root), trust auth, fsync/synchronous_commit/full_page_writes
  off; `stop()`, `start()`, `restart(gap)` (stop, wait `gap`, start), which
  return the moments it began shutting down and was ready again, read from
  the server's own log;
- `PrivateRedis`: a `redis-server` without persistence; `stop()` and
  `start()` on the same port;
- the app against them, as `make dist` runs it: `manage.py migrate`, an admin
  user (`ensure_admin`) and its API token (`create_api_token`), then daphne
  and N Celery worker processes (`--pool threads`), with the production
  defaults for leases, sweeps and the database pool. The test process's own
  TERRET_* settings (queue, channel prefix, TERRET_TESTING) are not passed on.

    with FakeLLM() as llm, Stack(llm_base_url=llm.base_url) as stack:
        stack.create_profile("fake", roles={"main": "test/model"})
        api = stack.client()
        sid = api.post("/api/sessions", json={"profile": "fake"}).json()["id"]
        stack.postgres.restart(gap=2.0)

`missing()` says why the stack cannot run here (no PostgreSQL binaries, no
redis-server, no `postgres` user), or None. Everything is stopped and the
directory removed at exit; TERRET_KEEP_STACK=1 keeps the directory (the
processes' logs are in its logs/, the server's in pg/server.log).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
PG_ROOT = Path("/usr/lib/postgresql")
PG_OS_USER = "postgres"
DB_USER = "root"
DB_NAME = "terret"

# Settings of the test process that must not leak into the stack's processes:
# they would point them at the shared services or change their defaults.
_SCRUBBED_PREFIXES = ("TERRET_", "CELERY_")
_SCRUBBED = {"DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "LOG_LEVEL"}


def pg_bindir() -> Path | None:
    """The bin directory of the newest PostgreSQL under /usr/lib/postgresql."""
    if not PG_ROOT.is_dir():
        return None

    def version(p: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in p.name.split(".") if part.isdigit())

    for candidate in sorted(PG_ROOT.iterdir(), key=version, reverse=True):
        bindir = candidate / "bin"
        if all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def missing() -> str | None:
    """Why a private stack cannot be started here, or None."""
    if pg_bindir() is None:
        return f"no PostgreSQL server binaries (initdb, pg_ctl) under {PG_ROOT}"
    if redis_binary() is None:
        return "no redis-server on PATH"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_OS_USER)
        except KeyError:
            return f"running as root but there is no {PG_OS_USER!r} OS user to run initdb"
        if shutil.which("runuser") is None:
            return "running as root but runuser is missing"
    return None


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Outage:
    """One stop/start of a service, in wall-clock seconds (time.time())."""

    down_at: float  # the service began to go away
    up_at: float  # it accepted connections again

    @property
    def length(self) -> float:
        return self.up_at - self.down_at


# -- PostgreSQL -----------------------------------------------------------------


class PrivatePostgres:
    """A throwaway cluster in `root/pg`, listening on 127.0.0.1:`port`."""

    SETTINGS = {
        "listen_addresses": "'127.0.0.1'",
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "200",
        "shared_buffers": "32MB",
        "log_min_messages": "warning",
        "log_connections": "off",
        # ready_at()/down_at() read these lines' timestamps
        "log_timezone": "'UTC'",
        "log_line_prefix": "'%m [%p] '",
    }

    def __init__(self, root: Path, port: int | None = None) -> None:
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError(f"no PostgreSQL binaries under {PG_ROOT}")
        self.bindir = bindir
        self.port = port or free_port()
        self.home = root / "pg"
        self.datadir = self.home / "data"
        self.logfile = self.home / "server.log"
        self._initialized = False

    def url(self, dbname: str = DB_NAME) -> str:
        return f"postgres://{DB_USER}@127.0.0.1:{self.port}/{dbname}"

    def _run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / tool), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", PG_OS_USER, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.home)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def init(self) -> None:
        self.home.mkdir(parents=True)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(PG_OS_USER)
            os.chown(self.home, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "-D", str(self.datadir), "-U", DB_USER, "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        conf = {**self.SETTINGS, "port": str(self.port), "unix_socket_directories": f"'{self.home}'"}
        lines = "".join(f"{key} = {value}\n" for key, value in conf.items())
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# tests/stack.py\n" + lines)
        self._initialized = True

    def start(self) -> float:
        """Start and wait until it accepts connections; the moment it became
        ready (time.time(), from the server's own log line)."""
        if not self._initialized:
            self.init()
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-w", "-t", "60", "start")
        _wait(self.accepting, 30, "PostgreSQL to accept connections")
        return self._last_logged("database system is ready to accept connections") or time.time()

    def stop(self, mode: str = "fast") -> float:
        """Stop (fast: every session is cut); the moment the server began
        cutting them (its log line: "received fast shutdown request")."""
        started = time.time()
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")
        return self._last_logged(f"received {mode} shutdown request") or started

    def restart(self, gap: float = 0.0) -> Outage:
        """Stop, stay down for `gap` seconds, start again."""
        down = self.stop()
        if gap:
            time.sleep(gap)
        return Outage(down, self.start())

    def _last_logged(self, message: str) -> float | None:
        """The time of the last server log line holding `message` (log_line_prefix '%m ', UTC)."""
        for line in reversed(self.log().splitlines()):
            if message in line:
                try:
                    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
                except ValueError:
                    return None
                return stamp.timestamp()
        return None

    def running(self) -> bool:
        return (self.datadir / "postmaster.pid").exists()

    def accepting(self) -> bool:
        import psycopg

        try:
            psycopg.connect(self.url("postgres"), connect_timeout=2).close()
        except psycopg.Error:
            return False
        return True

    def create_database(self, name: str = DB_NAME) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self._initialized and self.running():
            try:
                self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "-t", "30", "stop", timeout=60)
            except Exception:
                pass


# -- Redis ----------------------------------------------------------------------


class PrivateRedis:
    """A redis-server without persistence on 127.0.0.1:`port`."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        binary = redis_binary()
        if binary is None:
            raise RuntimeError("no redis-server on PATH")
        self.binary = binary
        self.port = port or free_port()
        self.dir = root / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logfile = self.dir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> float:
        """Start on the same port as before; the moment it answers PING."""
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.dir), "--logfile", str(self.logfile), "--daemonize", "no",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait(self.answering, 15, "redis-server to answer")
        return time.time()

    def answering(self) -> bool:
        import redis

        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop(self) -> float:
        """SIGTERM (no persistence: nothing is saved); the moment it was gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        return time.time()

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self.stop()


# -- the app's processes ----------------------------------------------------------


def _venv_bin(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", name]


class AppProcess:
    """One daphne or Celery worker process, its output in a file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], logdir: Path, cwd: Path = ROOT) -> None:
        """`cwd`: the code tree it runs (another release's, in the rolling-deploy drill)."""
        self.name = name
        self.logfile = logdir / f"{name}.log"
        self._log = open(self.logfile, "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.logfile.read_text(errors="replace")

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()[-4000:]}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL if it lingers."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        self._log.close()


class Stack:
    """PostgreSQL, Redis, daphne and `workers` Celery workers of our own.

    `profiles` ({name: AgentProfile fields}) are created at start; `env` is
    added to every process's environment (leave the lease and sweep settings
    alone to test the defaults)."""

    ADMIN = "alice"

    def __init__(
        self,
        *,
        llm_base_url: str,
        workers: int = 2,
        concurrency: int = 200,
        profiles: dict[str, dict[str, Any]] | None = None,
        **env: Any,
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="terret-stack-"))
        os.chmod(self.root, 0o755)  # the postgres user must reach root/pg
        self.logdir = self.root / "logs"
        self.logdir.mkdir()
        self.llm_base_url = llm_base_url
        self.n_workers = workers
        self.concurrency = concurrency
        self.extra_env = {k: str(v) for k, v in env.items()}
        self.profiles = dict(profiles or {})
        self.secret_key = secrets.token_urlsafe(40)
        self.postgres = PrivatePostgres(self.root)
        self.redis = PrivateRedis(self.root)
        self.http_port = free_port()
        self.daphne: AppProcess | None = None
        self.workers: list[AppProcess] = []
        self.token = ""
        self.timings: dict[str, float] = {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def env(self, **overrides: Any) -> dict[str, str]:
        """The environment of every process of the stack."""
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)}
        env.update(
            {
                "DATABASE_URL": self.postgres.url(),
                "REDIS_URL": self.redis.url(),
                "TERRET_WORKER": "celery",
                "SECRET_KEY": self.secret_key,
                "TERRET_LLM_BASE_URL": self.llm_base_url,
                "TERRET_LLM_API_KEY": "stack-test-key",
                "TERRET_VAR_DIR": str(self.root / "var"),
                "TERRET_WORKSPACE_ROOT": str(self.root / "workspaces"),
                "TERRET_DEMO_DELAY": "0",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        env.update({k: str(v) for k, v in overrides.items()})
        return env

    def manage(self, *args: str, timeout: float = 120, **env: Any) -> str:
        """Run `manage.py ARGS` against the stack; its stdout."""
        cmd = [sys.executable, "manage.py", *args]
        done = subprocess.run(cmd, cwd=ROOT, env=self.env(**env), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    # -- lifecycle

    def start(self) -> Stack:
        t0 = time.monotonic()
        self.postgres.start()
        self.postgres.create_database()
        self.redis.start()
        self.timings["services"] = time.monotonic() - t0
        self.manage("migrate", "--noinput")
        self.timings["migrate"] = time.monotonic() - t0
        # The processes boot while the admin, its token and the profiles are made.
        self.daphne = AppProcess(
            "daphne",
            [*_venv_bin("daphne"), "-b", "127.0.0.1", "-p", str(self.http_port), "terret_site.asgi:application"],
            self.env(),
            self.logdir,
        )
        for i in range(self.n_workers):
            self.add_worker(wait=False, index=i)
        password = secrets.token_urlsafe(12)
        self.manage("ensure_admin", TERRET_ADMIN_USER=self.ADMIN, TERRET_ADMIN_PASSWORD=password)
        self.token = self.manage("create_api_token", self.ADMIN, "--name", "tests/stack.py").strip()
        for name, fields in self.profiles.items():
            self.create_profile(name, **fields)
        self.wait_serving()
        for worker in self.workers:
            self.wait_worker_ready(worker)
        self.timings["start"] = time.monotonic() - t0
        return self

    def add_worker(self, *, wait: bool = True, index: int | None = None) -> AppProcess:
        """A worker as `make dist` starts it (threads pool; one -Q, the default queue)."""
        i = len(self.workers) if index is None else index
        cmd = [
            sys.executable, "-m", "terret_site.worker", "--pool", "threads",
            "--concurrency", str(self.concurrency), "-Q", "terret", "-n", f"stack{i}-{os.getpid()}@%h",
            "--loglevel", "INFO",
        ]  # fmt: skip
        worker = AppProcess(f"worker{i}", cmd, self.env(), self.logdir)
        self.workers.append(worker)
        if wait:
            self.wait_worker_ready(worker)
        return worker

    def wait_worker_ready(self, worker: AppProcess, timeout: float = 60.0) -> None:
        def ready() -> bool:
            worker.check_alive()
            return " ready." in worker.output()

        _wait(ready, timeout, f"{worker.name} to be ready", interval=0.1)

    def wait_serving(self, timeout: float = 60.0) -> None:
        assert self.daphne is not None
        daphne = self.daphne

        def serving() -> bool:
            daphne.check_alive()
            try:
                return httpx.get(f"{self.base_url}/api/openapi.json", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(serving, timeout, "daphne to serve", interval=0.1)

    def close(self) -> None:
        for proc in [*self.workers, *([self.daphne] if self.daphne else [])]:
            try:
                proc.stop()
            except Exception:
                pass
        self.redis.close()
        self.postgres.close()
        if os.environ.get("TERRET_KEEP_STACK") != "1":
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Stack:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- conveniences

    def client(self, timeout: float = 10.0) -> httpx.Client:
        """An HTTP client for the API, signed in with the admin's token."""
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout)

    def create_profile(self, name: str, **fields: Any) -> None:
        """An AgentProfile in the stack's database (profiles are admin-managed: no API)."""
        spec = json.dumps({"name": name, **fields})
        code = (
            "import json; from sessions_app.models import AgentProfile; "
            f"AgentProfile.objects.create(**json.loads({spec!r}))"
        )
        self.manage("shell", "-c", code)

    def logs(self, tail: int = 3000) -> str:
        """Every process's output, the last `tail` characters of each (for failure messages)."""
        parts = [f"--- postgres\n{self.postgres.log()[-tail:]}", f"--- redis\n{self.redis.log()[-tail:]}"]
        for proc in [*([self.daphne] if self.daphne else []), *self.workers]:
            parts.append(f"--- {proc.name}\n{proc.output()[-tail:]}")
        return "\n".join(parts)
