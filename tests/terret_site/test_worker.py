"""terret_site/worker.py, the worker launcher the Procfile and `make dist` use.

Its worth is a shorter boot (a fresh worker's boot is recovery time): these
tests hold what makes it short, that a worker process imports none of what
only the web process or Celery's command line needs, and the collector
paused during the boot is running again once the worker is ready. That it
runs turns, recovers and drains is every worker test's (tests/workers.py
starts workers through it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.workers import ROOT, worker_env

# What a worker must not import at boot: the API's ninja and pydantic (the MCP
# SDK brings pydantic later, after the first sweep), the admin's modules,
# Celery's command line (click-repl and prompt-toolkit; click itself comes
# with httpx), and the feed parser (on a monitor's first scan).
WEB_ONLY = (
    "ninja",
    "pydantic",
    "sessions_app.admin",
    "sessions_app.api.views",
    "django_stubs_ext",
    "click_repl",
    "prompt_toolkit",
    "feedparser",
    # Optional integrations refused while a worker boots (NOT_AT_BOOT):
    # redis-py's look for the OpenTelemetry metrics SDK, httpx's command line.
    "opentelemetry.sdk.metrics",
    "httpx._main",
    "pygments",
)

PROBE = """
import gc, os, sys, threading
from celery.signals import worker_ready

seen = []
queues = []

def at_ready(sender=None, **_):
    seen.extend(m for m in sys.argv[1].split(",") if m in sys.modules)
    queues.extend(q.name for q in sender.task_consumer.queues)
    # After the launcher's own worker_ready receiver (connected after this
    # one); to the real stdout, which Celery has redirected to its log.
    threading.Timer(0.3, report).start()

def report():
    import importlib
    importlib.import_module("opentelemetry.sdk.metrics")  # refused at boot only
    os.write(1, ("PROBE %s %s %s\\n" % (",".join(seen), gc.isenabled(), ",".join(queues))).encode())
    os._exit(0)

worker_ready.connect(at_ready, weak=False)
from terret_site.worker import main
main(["-n", "probe-%d@%%h" % os.getpid(), "-c", "2", "-l", "WARNING"])  # no -Q: the deployment's queue
"""


def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.worker
def test_a_worker_boots_without_the_web_only_modules_on_the_deployments_queue(transactional_db: None) -> None:
    done = run("-c", PROBE, ",".join(WEB_ONLY), env=worker_env())
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROBE")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-4000:]
    _, imported, collecting, queues = line.split(" ")
    assert imported == "", f"imported at boot: {imported}"
    assert collecting == "True"
    assert queues == worker_env()["TERRET_QUEUE"]  # without -Q, the queue turns are sent to


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--pool", "gevent"], "invalid choice: 'gevent'"),
        (["--pool", "prefork"], "invalid choice: 'prefork'"),
        (["--autoscale", "4,1"], "unrecognized arguments: --autoscale"),
    ],
)
def test_an_option_it_does_not_know_is_refused_before_anything_starts(argv: list[str], message: str) -> None:
    done = run("-m", "terret_site.worker", *argv, timeout=30)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Connected to" not in done.stderr + done.stdout
