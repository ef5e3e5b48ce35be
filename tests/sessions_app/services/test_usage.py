"""Cost: the running totals (Session row, UsageDay) always equal the log's own
sum, compaction never resets them, unknown prices stay "unpriced", and the
figures hold after a worker is SIGKILLed and replaced and when a fresh
process recomputes them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Sum

from sessions_app import log, services
from sessions_app.models import AgentProfile, Event, Session, UsageDay
from sessions_app.services import compaction
from sessions_app.services.usage import Totals, check_session, format_cost, log_sum_by_day, totals_of, usage
from tests.fakes.fake_llm import Reply, responder_for_mode

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]


def _u(prompt: int, completion: int, cost: float | None) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "cost": cost}


@pytest.fixture
def profile() -> AgentProfile:
    return AgentProfile.objects.create(name="u", roles={"main": "test/main", "compactor": "demo/offline"})


def _profile_days(profile: AgentProfile) -> Totals:
    agg = UsageDay.objects.filter(profile=profile).aggregate(
        steps=Sum("steps"),
        unpriced_entries=Sum("unpriced_entries"),
        prompt_tokens=Sum("prompt_tokens"),
        completion_tokens=Sum("completion_tokens"),
        cost=Sum("cost"),
    )
    return totals_of(agg)


def test_running_totals_equal_the_log_sum(make_user: Any, profile: AgentProfile, settings: Any) -> None:
    settings.TERRET_WORKER = "manual"
    s = services.create_session(make_user(), profile)
    entries = [
        ("step/end", {"step": 1, "usage": _u(100, 10, 0.001)}),
        ("step/end", {"step": 2, "usage": _u(200, 20, None)}),  # unpriced: counted, not $0
        ("step/end", {"step": 3}),  # closed by a resume, figure lost: unpriced
        ("usage/recorded", {"purpose": "title", "model": "t", "usage": _u(7, 3, 0.0005)}),
    ]
    log.append(s.id, "turn/start", {})
    log.append(s.id, "user/message", {"text": "hello"})
    for kind, data in entries:
        log.append(s.id, kind, data)
    log.append(s.id, "turn/end", {"status": "completed"})
    assert compaction.compact(s.id, manual=True) is not None  # the demo compactor records its usage too
    log.append(s.id, "step/end", {"step": 4, "usage": _u(1, 1, 0.25)})

    s.refresh_from_db()
    consistent, running, summed = check_session(s.id)
    assert consistent and running == summed
    assert (summed.steps, summed.unpriced) == (4, 2)
    assert summed.prompt_tokens > 307  # 100 + 200 + 7 + 1 + the summarizer's
    assert usage(s) == running.as_dict()
    assert usage(s)["cost"] == Decimal("0.2515")  # the demo model prices at 0
    # per profile per day: the same figures
    assert _profile_days(profile) == summed
    assert log_sum_by_day([s.id]) == {day: totals_of(row) for day, row in _days(profile)}


def _days(profile: AgentProfile) -> list[tuple[Any, UsageDay]]:
    return [(row.day, row) for row in UsageDay.objects.filter(profile=profile)]


def test_usage_day_is_one_row_per_profile_day_and_shard(make_user: Any, profile: AgentProfile, settings: Any) -> None:
    settings.TERRET_WORKER = "manual"
    settings.TERRET_TALLY_SHARDS = 1  # every session on one row (the sharded case: test_hot_profile.py)
    a = services.create_session(make_user(), profile)
    b = services.create_session(make_user(), profile)
    for sid in (a.id, b.id, a.id):
        log.append(sid, "step/end", {"step": 1, "usage": _u(10, 1, 0.5)})
    (row,) = UsageDay.objects.filter(profile=profile)
    assert (row.steps, row.prompt_tokens, row.completion_tokens, row.cost, row.unpriced_entries) == (
        3,
        30,
        3,
        Decimal("1.5"),
        0,
    )
    # rejected appends touch neither total
    with pytest.raises(log.InvalidPayload):
        log.append(a.id, "step/end", {"step": 1, "usage": _u(-1, 1, 0.5)})
    row.refresh_from_db()
    assert row.steps == 3


def test_rolled_back_append_leaves_no_usage(make_user: Any, profile: AgentProfile) -> None:
    from django.db import transaction

    s = services.create_session(make_user(), profile)
    with pytest.raises(RuntimeError), transaction.atomic():
        log.append(s.id, "step/end", {"step": 1, "usage": _u(10, 1, 0.5)})
        raise RuntimeError
    assert not UsageDay.objects.filter(profile=profile).exists()
    s.refresh_from_db()
    assert s.steps == 0


def test_format_cost_counts_unpriced_beside_the_priced_part() -> None:
    # issue 34: one unpriced call leaves the total as "$X + 1 unpriced", never a bare "unpriced"
    assert format_cost(Decimal(0), 2) == "$0.0000 + 2 unpriced"
    assert format_cost(Decimal("0.25"), 1) == "$0.2500 + 1 unpriced"
    assert format_cost(Decimal("0.01234"), 0) == "$0.0123"
    assert format_cost(Decimal("0.5"), 1) == "$0.5000 + 1 unpriced"
    assert format_cost(Decimal(0), 0) == "$0.0000"  # priced at zero (the demo model) is a real $0


# ---------------------------------------------------------------- restart


def _fresh_process_check(session_ids: list[str]) -> dict[str, Any]:
    """Recompute in a brand-new interpreter against the same database."""
    from tests.workers import worker_env

    code = (
        "import django, json, sys; django.setup();"
        "from sessions_app.services.usage import check_session;"
        "out = {}\n"
        "for sid in sys.argv[1:]:\n"
        "    ok, running, summed = check_session(sid)\n"
        "    out[sid] = {'ok': ok, 'running': str(running.as_dict()), 'summed': str(summed.as_dict())}\n"
        "print(json.dumps(out))"
    )
    env = worker_env(DJANGO_SETTINGS_MODULE="terret_site.settings", TERRET_WORKER="manual")
    done = subprocess.run(
        [sys.executable, "-c", code, *session_ids], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.worker
def test_totals_survive_a_killed_worker_and_a_fresh_process(
    start_worker: Any, fake_llm: Any, make_user: Any, settings: Any, tmp_path: Any
) -> None:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(
        name="restart", roles={"main": "test/main"}, builtin_tools=["debug.noop"], allow_floor=["*"]
    )
    slow = responder_for_mode("tool-then-final", "debug.noop", latency=0.4)

    def respond(body: dict[str, Any]) -> Reply:
        reply = slow(body)
        reply.usage = (1000 + len(body["messages"]), 7, None if len(body["messages"]) % 3 == 0 else 0.0001)
        return reply

    fake_llm.responder = respond
    sessions = [services.create_session(make_user(), profile) for _ in range(4)]
    first = start_worker(name="a", concurrency=4)
    for s in sessions:
        services.inject(s.id, "work, please", wake=True)
    _wait(lambda: Event.objects.filter(session__in=sessions, kind="step/end").exists(), 30, "a first step/end")
    first.kill()  # SIGKILL mid-turn: no cleanup code runs
    killed_at = {s.id: Session.objects.get(id=s.id).last_seq for s in sessions}
    second = start_worker(name="b", concurrency=4)
    _wait(
        lambda: all(Event.objects.filter(session=s, kind="turn/end").exists() for s in sessions),
        60,
        "every turn to end on the replacement worker",
    )
    for s in sessions:
        services.inject(s.id, "once more", wake=True)
    _wait(
        lambda: all(Event.objects.filter(session=s, kind="turn/end").count() == 2 for s in sessions),
        60,
        "the second turns",
    )
    # post_turn ran on the workers (Celery task): each session titled exactly once
    _wait(
        lambda: all(Session.objects.get(id=s.id).title for s in sessions),
        30,
        "titles from the post_turn task",
    )
    second.kill()
    assert all(Event.objects.filter(session=s, kind="session/titled").count() == 1 for s in sessions)
    assert any(Session.objects.get(id=s.id).last_seq > killed_at[s.id] for s in sessions)

    # in this process: running totals == the log's sum, per session and per profile/day
    grand = Totals()
    for s in sessions:
        ok, running, summed = check_session(s.id)
        assert ok, (running, summed)
        assert summed.steps >= 4
        grand = grand + summed
    assert _profile_days(profile) == grand
    assert grand.unpriced > 0 and grand.cost > 0
    # and in a fresh process that shares nothing with this one
    fresh = _fresh_process_check([str(s.id) for s in sessions])
    assert all(v["ok"] for v in fresh.values()), fresh
