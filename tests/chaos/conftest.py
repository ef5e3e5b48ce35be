"""Fixtures of the chaos pass (docs/chaos.md): one private stack for every
drill (our own PostgreSQL and redis-server, daphne and two Celery workers
as `make dist` runs them, the production lease, sweep and pool settings),
the fake model server in this process, the invariants probe, and the seed.

Every drill starts from two ready workers, and leaves both services up,
so the drills may run in any order or alone (`make chaos ARGS='-k soak'`).
The figures each drill printed are repeated at the end of the run.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest

from tests import stack as stack_module
from tests.chaos import harness
from tests.chaos.harness import Chaos, Model
from tests.chaos.invariants import Probe
from tests.fakes.fake_llm import FakeLLM
from tests.stack import Stack


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if harness.SUMMARY:
        terminalreporter.section("chaos figures")
        for line in harness.SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def chaos_seed() -> int:
    value = harness.seed()
    print(f"\n[chaos] seed {value} (replay: TERRET_CHAOS_SEED={value} make chaos)", flush=True)
    harness.SUMMARY.append(f"[chaos] seed {value} (replay: TERRET_CHAOS_SEED={value} make chaos)")
    return value


@pytest.fixture(scope="session")
def model() -> Model:
    return Model()


@pytest.fixture(scope="session")
def fake(model: Model) -> Iterator[FakeLLM]:
    with FakeLLM(model) as llm:
        yield llm


@pytest.fixture(scope="session")
def stack(fake: FakeLLM) -> Iterator[Stack]:
    reason = stack_module.missing()
    if reason is not None:
        if os.environ.get("TERRET_NO_SKIP") == "1":
            pytest.fail(f"TERRET_NO_SKIP=1 but the private stack cannot run: {reason}")
        pytest.skip(f"private stack: {reason}")
    profiles = {harness.PROFILE: harness.PROFILE_FIELDS, harness.TASK_PROFILE: harness.TASK_PROFILE_FIELDS}
    with Stack(llm_base_url=fake.base_url, workers=2, profiles=profiles, TERRET_FAILPOINTS=harness.FAILPOINTS) as s:
        harness.summary("stack", up_s=s.timings["start"])
        yield s


@pytest.fixture(scope="session")
def probe(stack: Stack) -> Iterator[Probe]:
    # No pool: the probe's one connection is replaced at once after a restart.
    p = Probe(stack.env(TERRET_DB_POOL_MAX=0), stack.logdir / "probe.log")
    yield p
    p.close()


@pytest.fixture
def chaos(stack: Stack, model: Model, probe: Probe, chaos_seed: int, request: pytest.FixtureRequest) -> Iterator[Chaos]:
    """The harness for one drill: its own random stream (the seed and the drill's name), fresh receipts."""
    rng = random.Random(f"{chaos_seed}:{request.node.name}")
    c = Chaos(stack, model, probe, rng, chaos_seed)
    c.ensure_workers(2)
    yield c
    c.client.close()
    # The next drill starts from two ready workers and both services up.
    if not stack.postgres.accepting():
        stack.postgres.start()
    if not stack.redis.answering():
        stack.redis.start()
