"""`python -m terret_site.worker`: Terret's Celery worker, started without Celery's command line.

A worker's boot is on the recovery path: when every worker is gone, the turns
wait for a freshly started process, and its imports are most of that wait
(bench/peers.py, "a freshly started process recovers"). `celery`'s command
line imports click, click-repl and prompt-toolkit (about 0.13 s) to parse six
options, and the cyclic garbage collector runs dozens of times over the
objects the imports make (about 0.1 s). This module builds the same worker
(`app.Worker`, as `celery worker` builds it) from the options the Procfile
sets, with the collector paused until the worker is ready.

Anything else `celery worker` offers (autoscale, a state db, detach, ...):
run `celery -A terret_site worker ...`; the worker is the same.
"""

from __future__ import annotations

import argparse
import gc
import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

DEFAULTS = {"pool": "threads", "concurrency": 200, "loglevel": "INFO"}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m terret_site.worker", description=__doc__.split("\n")[0])
    # Not prefork: its children fork before worker_ready and would keep the
    # collector paused for good (celery's command line starts a prefork pool).
    p.add_argument("-P", "--pool", default=DEFAULTS["pool"], choices=("threads", "solo"))
    p.add_argument("-c", "--concurrency", type=int, default=DEFAULTS["concurrency"])
    p.add_argument("-Q", "--queues", default="", help="comma-separated queue names (default: TERRET_QUEUE's)")
    p.add_argument("-n", "--hostname", default=None, help="node name, as celery's: %%h, %%n and %%d expand")
    p.add_argument("-l", "--loglevel", default=DEFAULTS["loglevel"])
    # Always on for Terret's workers (terret_site/broker.py, Consumer); accepted so that
    # a `celery worker` line can be switched over word for word.
    p.add_argument("--without-mingle", action="store_true")
    p.add_argument("--without-gossip", action="store_true")
    p.add_argument("--without-heartbeat", action="store_true")
    args = p.parse_args(argv)
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    return args


# Optional integrations that libraries a worker loads import when they find
# them installed, and that a worker never uses: redis-py imports the
# OpenTelemetry metrics SDK (about 40 ms) only to learn whether it could
# export metrics of its own (Terret's tracing is its own, runtime/tracing.py,
# and loads the SDK's tracing when it is on), httpx its command line (Pygments
# and, in a development environment, rich: about 40 ms). Refused while the
# worker boots, so each library takes its "not installed" path; importable
# again once the worker is ready.
NOT_AT_BOOT = frozenset({"opentelemetry.sdk.metrics", "httpx._main"})


class _NotAtBoot(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if name in NOT_AT_BOOT:
            raise ImportError(f"{name} is not imported while a worker boots (terret_site/worker.py)", name=name)
        return None


_finder = _NotAtBoot()


def _collect_again(**_: Any) -> None:
    # The boot's objects live as long as the process: frozen, later
    # collections do not walk them again.
    gc.freeze()
    gc.enable()
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    gc.disable()  # until worker_ready (_collect_again)
    sys.meta_path.insert(0, _finder)  # until worker_ready too
    # Here, not at the top: the imports (Django and every app, at the
    # worker's start; Celery's app object came with the package,
    # terret_site/__init__.py) run with the collector paused and the finder
    # in place, and a bad option was refused before any of them.
    from celery import concurrency
    from celery.signals import worker_ready
    from celery.utils.nodenames import default_nodename, host_format

    from terret_site.celery import app  # local: see above

    worker_ready.connect(_collect_again, weak=False)
    worker = app.Worker(
        hostname=host_format(default_nodename(args.hostname)),
        pool_cls=concurrency.get_implementation(args.pool),
        concurrency=args.concurrency,
        queues=[q for q in args.queues.split(",") if q] or None,  # None: the app's default queue (settings)
        loglevel=args.loglevel.upper(),
        without_mingle=True,
        without_gossip=args.without_gossip,
        without_heartbeat=args.without_heartbeat,
    )
    worker.start()
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main())
