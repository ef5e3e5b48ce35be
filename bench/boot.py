"""A worker's boot: its start to Celery's ` ready.` line, the Procfile's launcher against `celery`.

  DATABASE_URL=postgres://root@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/11 \\
      .venv/bin/python bench/boot.py [--rounds 8] [--against REV]

A fresh worker's boot is on the recovery path when no other worker is alive
(bench/peers.py, "a freshly started process recovers"). Measured here alone,
with nothing else in the process: the Procfile's `worker` line (through
`python -m terret_site.worker`) against the same worker started by Celery's
command line (`celery -A terret_site worker`, the same options and
`--without-mingle`), the baseline, in the same run, rounds alternating.
`--against REV` adds REV's own Procfile line, run from a git worktree of REV
(e.g. the commit before a change to the boot). The medians and every ratio
to the baseline are printed.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._setup import ROOT, scratch_database  # noqa: E402

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
os.environ.setdefault("TERRET_QUEUE", "bench-boot")
os.environ.setdefault("TERRET_CHANNEL_PREFIX", "bench-boot")
os.environ["TERRET_WORKER"] = "celery"


def procfile_argv(tree: Path, name: str) -> list[str]:
    """The tree's Procfile `worker` line as argv: this interpreter, this bench's queue and node name."""
    line = next(x for x in (tree / "Procfile").read_text().splitlines() if x.startswith("worker:"))
    argv = shlex.split(line.split(":", 1)[1])
    argv = [sys.executable, *argv[1:]] if argv[0] == "python" else [sys.executable, "-m", *argv]
    argv[argv.index("-Q") + 1] = os.environ["TERRET_QUEUE"]
    argv[argv.index("-n") + 1] = f"{name}@%h"
    return argv


def celery_argv(name: str) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "terret_site", "worker", "--pool", "threads", "--concurrency", "200",
        "--without-mingle", "-Q", os.environ["TERRET_QUEUE"], "-n", f"{name}@%h", "--loglevel", "INFO",
    ]  # fmt: skip


def boot(argv: list[str], cwd: Path, timeout: float = 60) -> float:
    """Seconds from the process's start to its ` ready.` line; the process is then stopped."""
    env = dict(os.environ, PYTHONPATH=str(cwd))
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    took = None
    deadline = started + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if b" ready." in line:
            took = time.perf_counter() - started
            break
        if time.perf_counter() > deadline:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if took is None:
        raise SystemExit(f"{argv[:4]} never became ready")
    return took


def worktree(rev: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="terret-bench-boot-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-f", str(path), rev], cwd=ROOT, check=True, capture_output=True
    )
    for package in ("terret_site", "sessions_app", "approvals_app", "policies_app"):
        compileall.compile_dir(path / package, quiet=1)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--against", metavar="REV", help="also boot REV's Procfile line, from a git worktree")
    opts = parser.parse_args()
    scratch_database("terret_bench_boot")
    cases: dict[str, tuple[list[str], Path]] = {
        "celery -A terret_site worker (baseline)": (celery_argv("boot-celery"), ROOT),
        "the Procfile's line (python -m terret_site.worker)": (procfile_argv(ROOT, "boot-procfile"), ROOT),
    }
    tree = None
    if opts.against:
        tree = worktree(opts.against)
        cases[f"{opts.against}'s Procfile line"] = (procfile_argv(tree, "boot-against"), tree)
    times: dict[str, list[float]] = {k: [] for k in cases}
    try:
        boot(*cases[next(iter(cases))])  # a first boot, not counted: the page cache
        for _ in range(opts.rounds):
            for what, (argv, cwd) in cases.items():
                times[what].append(boot(argv, cwd))
    finally:
        if tree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    base = statistics.median(next(iter(times.values())))
    print(f"a worker's start -> ready, median of {opts.rounds} rounds (alternating), default settings:")
    for what, got in times.items():
        med = statistics.median(got)
        rounds = ", ".join(f"{t * 1000:.0f}" for t in got)
        print(f"  {what:55s} {med * 1000:6.0f} ms   ratio {med / base:.2f}   [{rounds}]")


if __name__ == "__main__":
    main()
