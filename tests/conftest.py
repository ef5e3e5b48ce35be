"""Shared fixtures and the skip policy.

Tests that need real PostgreSQL, Redis or worker processes carry a marker.
Where the service is not configured they are skipped with a loud reason; with
TERRET_NO_SKIP=1 (CI) such a skip becomes a failure instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings

NO_SKIP = os.environ.get("TERRET_NO_SKIP") == "1"

# The browser fixtures (daphne as a process, Debian's chromium), for every test folder.
pytest_plugins = ["tests.browser.fixtures"]


def _missing(marker: str) -> str | None:
    if marker in ("postgres", "worker") and not settings.IS_POSTGRES:
        return "needs PostgreSQL: set DATABASE_URL=postgres://..."
    if marker in ("redis", "worker") and not settings.REDIS_URL:
        return "needs Redis: set REDIS_URL=redis://..."
    if marker == "embedded" and (settings.IS_POSTGRES or settings.REDIS_URL):
        return "embedded-path test: runs in the SQLite pass (no DATABASE_URL, no REDIS_URL)"
    if marker == "browser" and not os.path.exists("/usr/bin/chromium"):
        return "needs Debian's chromium: apt-get install chromium chromium-driver"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in ("postgres", "redis", "worker", "browser", "embedded"):
        if item.get_closest_marker(marker) is None:
            continue
        reason = _missing(marker)
        if reason is None:
            continue
        if NO_SKIP and marker != "embedded":
            pytest.fail(f"TERRET_NO_SKIP=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def fast_password_hashing(request: pytest.FixtureRequest, settings: Any) -> None:
    # Every actor is a real user with a password; PBKDF2 would dominate the
    # tests. Not for browser tests: their daphne process checks the password
    # with the real hashers when the browser signs in.
    if request.node.get_closest_marker("browser") is None:
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def no_learned_windows() -> Any:
    """A context window one test's fake provider taught this process
    (runtime/windows.py keeps it for a minute) must not shrink the next
    test's requests: its ModelWindow row is gone with the test's database."""
    yield
    from sessions_app.runtime import counters, limits, versions, windows

    windows.forget()
    versions.forget()  # agent versions cached by (profile, number): the next test's profile may reuse the pk
    limits.forget_suspensions()  # the same for this process's copy of the operators' suspensions
    counters.forget()  # and for counts a sweep round could not flush


@pytest.fixture
def make_user(django_user_model: Any) -> Callable[..., Any]:
    counter = iter(range(1, 1_000_000))

    def make(username: str | None = None, **kwargs: Any) -> Any:
        name = username or f"user{next(counter)}"
        return django_user_model.objects.create_user(username=name, password="pw-" + name, **kwargs)

    return make


@pytest.fixture
def make_session(make_user: Callable[..., Any]) -> Callable[..., Any]:
    from sessions_app.models import Session

    def make(owner: Any = None, **kwargs: Any) -> Session:
        return Session.objects.create(owner=owner or make_user(), **kwargs)

    return make


@pytest.fixture
def manual_worker(settings: Any, tmp_path: Any) -> None:
    """Turns run only when a test drives them (TERRET_WORKER=manual), with a
    workspace of the test's own."""
    settings.TERRET_WORKER = "manual"
    settings.TERRET_WORKSPACE_ROOT = tmp_path


@pytest.fixture
def owner(make_user: Callable[..., Any]) -> Any:
    return make_user("owner")


@pytest.fixture
def profile(db: None) -> Any:
    """The test profile: the scripted model (test/model, answered by fake_llm)
    and the built-in tools the runtime tests call, every tool allowed."""
    from sessions_app.models import AgentProfile

    return AgentProfile.objects.create(
        name="t",
        roles={"main": "test/model"},
        builtin_tools=["workspace.write", "workspace.read", "clock.now", "debug.noop", "debug.sleep"],
        allow_floor=["*"],
    )


@pytest.fixture
def session(owner: Any, profile: Any) -> Any:
    """A session of `owner` on `profile` (a module may override either), with
    its live agent spawned already (its log starts with agent/spawned; the
    runtime would otherwise spawn it on the first drive)."""
    from sessions_app import services

    session = services.create_session(owner, profile)
    services.spawn_agent(session, profile)
    return session


@pytest.fixture
def make_reviewer(make_user: Callable[..., Any]) -> Callable[..., Any]:
    """A user in the "reviewers" group (approvals_app's migration creates it;
    transactional tests flush it away, so it is re-made here the same way)."""
    from django.contrib.auth.models import Group, Permission

    def make(username: str | None = None, **kwargs: Any) -> Any:
        user = make_user(username, **kwargs)
        group, _ = Group.objects.get_or_create(name="reviewers")
        group.permissions.add(
            Permission.objects.get(content_type__app_label="approvals_app", codename="decide_approval")
        )
        user.groups.add(group)
        return user

    return make


@pytest.fixture
def start_worker(transactional_db: None) -> Any:
    """Start real Celery worker processes: `start_worker(**env_overrides)`.
    Every worker started is SIGKILLed at teardown, before the database is flushed."""
    from tests.workers import WorkerProcess, purge_queue

    purge_queue()
    started: list[WorkerProcess] = []

    def start(*, wait: bool = True, **kwargs: Any) -> WorkerProcess:
        worker = WorkerProcess(**kwargs)
        started.append(worker)
        return worker.wait_ready() if wait else worker

    yield start
    for worker in started:
        worker.kill()
    purge_queue()


@pytest.fixture
def fake_llm(settings: Any) -> Any:
    """A local OpenAI-compatible SSE server; the settings point the adapter at it."""
    from tests.fakes.fake_llm import FakeLLM

    with FakeLLM() as fake:
        settings.TERRET_LLM_BASE_URL = fake.base_url
        settings.TERRET_LLM_API_KEY = "test-key"
        yield fake


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Any:
    """After the run, end connections other threads or killed worker processes
    left on the test database, so pytest-django can drop it. First this
    process's own background threads (the embedded sweeper, clock and sender
    that importing terret_site.asgi starts) are told to drain, as a stopping
    process tells them: they would otherwise go on querying a database that
    is gone, and log it while the interpreter exits."""
    yield
    from django.db import connection

    from sessions_app.runtime import lifecycle

    lifecycle.draining.set()
    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Browser tests run last: Playwright's sync API keeps an event loop
    running in the main thread while its browser is open, and pytest-asyncio
    tests cannot start their own loop after that."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)
