"""One profile, many agents: its daily tallies (UsageDay, ModelTally,
TurnTally) are sharded (TERRET_TALLY_SHARDS rows per profile and day, a
session always writing its own), so no row is written by every step, every
read sums the shards, and the profile's daily budget holds under 200 turns
at once (runtime/limits.py states the bound of the steps in flight)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from sessions_app import services
from sessions_app.log.runs import tally_shard
from sessions_app.models import AgentProfile, Event, ModelTally, Session, TurnTally, UsageDay
from sessions_app.runtime import limits
from sessions_app.runtime.drive import drive
from sessions_app.services.budgets import daily_budgets
from sessions_app.services.usage import log_sum_by_day
from tests.fakes.fake_llm import Reply
from tests.helpers import edit_profile, events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

COST = 0.001  # a request's price: 15 tokens and $0.001
USAGE = (10, 5, COST)


def _sessions_on_distinct_shards(owner: Any, profile: AgentProfile, n: int) -> list[Session]:
    """n sessions of the profile whose ids fall on n different shards."""
    found: dict[int, Session] = {}
    while len(found) < n:
        session = services.create_session(owner, profile)
        found.setdefault(tally_shard(session.id), session)
    return list(found.values())


def _three_steps() -> list[Reply]:
    return [
        Reply(tool_calls=[("debug.noop", {})], usage=USAGE),
        Reply(tool_calls=[("debug.noop", {})], usage=USAGE),
        Reply(text="done", usage=USAGE),
    ]


@pytest.mark.usefixtures("manual_worker")
def test_no_tally_row_of_a_profile_is_written_by_every_step(
    fake_llm: Any, owner: Any, profile: AgentProfile, settings: Any
) -> None:
    """Four sessions of one profile on four shards run a three-step turn
    each: every tally row holds one session's steps only (none all twelve),
    and every reader (the budget check, the budget page, the log) sums
    them to the same figures. Both backends."""
    settings.TERRET_TALLY_SHARDS = 16
    sessions = _sessions_on_distinct_shards(owner, profile, 4)
    for session in sessions:
        fake_llm.script(*_three_steps())
        services.run_turn(session.id, "go")
        assert drive(session.id) == "ended"
    assert len(fake_llm.requests) == 12
    today = timezone.now().date()
    shards = sorted(tally_shard(s.id) for s in sessions)

    days = UsageDay.objects.filter(profile=profile, day=today).order_by("shard")
    assert [row.shard for row in days] == shards
    assert [(row.steps, row.turns, row.prompt_tokens, row.completion_tokens) for row in days] == [(3, 1, 30, 15)] * 4
    models = ModelTally.objects.filter(profile=profile, day=today).order_by("shard")
    assert [(row.shard, row.requests) for row in models] == [(shard, 3) for shard in shards]
    turns = TurnTally.objects.filter(profile=profile, day=today).order_by("shard")
    assert [(row.shard, row.count) for row in turns] == [(shard, 1) for shard in shards]

    spent = limits.day_spent(profile.pk)
    assert (spent.steps, spent.turns, spent.tokens, spent.cost_usd) == (12, 4, 180, Decimal("0.012"))
    assert limits.day_spent(None) == spent
    logged = log_sum_by_day([s.id for s in sessions])[today]
    assert (logged.steps, logged.cost) == (12, Decimal("0.012"))
    edit_profile(profile, daily_steps=100)
    (view,) = daily_budgets([profile.name], include_global=False)
    assert {line.budget: line.spent for line in view.lines}["steps"] == "12"


@pytest.mark.usefixtures("manual_worker")
def test_with_one_shard_every_step_writes_the_same_row(
    fake_llm: Any, owner: Any, profile: AgentProfile, settings: Any
) -> None:
    """The baseline the sharding removes (TERRET_TALLY_SHARDS=1): the
    same four turns land on one row, written by all twelve steps."""
    settings.TERRET_TALLY_SHARDS = 1
    sessions = [services.create_session(owner, profile) for _ in range(4)]
    for session in sessions:
        fake_llm.script(*_three_steps())
        services.run_turn(session.id, "go")
        assert drive(session.id) == "ended"
    (row,) = UsageDay.objects.filter(profile=profile)
    assert (row.shard, row.steps, row.turns) == (0, 12, 4)
    assert limits.day_spent(profile.pk).steps == 12


def test_a_sessions_shard_is_stable_and_spread() -> None:
    ids = [uuid.uuid4() for _ in range(1600)]
    assert all(tally_shard(i) == tally_shard(str(i)) for i in ids)
    counts = [0] * 16
    for i in ids:
        counts[tally_shard(i)] += 1
    assert min(counts) > 50, counts  # about 100 each: no shard takes the profile's whole load


# ---------------------------------------------------------------- 200 turns at once, real workers

TURNS = 200
LIMIT_STEPS = 40  # the profile's daily cost budget, in requests: $0.040
WORKERS, THREADS = 2, 8  # a turn runs on one worker thread: at most 16 steps in flight


def _settled(session_ids: list[uuid.UUID]) -> dict[str, int]:
    """Per session: its turn ended, or its input held (no turn opened)."""
    ended = set(Event.objects.filter(session_id__in=session_ids, kind="turn/end").values_list("session_id", flat=True))
    held = set(Event.objects.filter(session_id__in=session_ids, kind="input/held").values_list("session_id", flat=True))
    return {"ended": len(ended), "held": len(held - ended), "settled": len(ended | held)}


@pytest.mark.postgres
@pytest.mark.worker
def test_200_concurrent_turns_pass_a_profiles_daily_budget_by_at_most_the_steps_in_flight(
    start_worker: Any, fake_llm: Any, make_user: Any, settings: Any
) -> None:
    """200 sessions of one profile each get a one-step turn at once, run by
    two real worker processes (16 threads), the model priced at $0.001 a
    request, the profile's daily cost budget $0.040 (40 requests).

    The bound (runtime/limits.py): a check reads committed spend only, so
    the steps in flight past their checks when the spend reaches the limit
    all finish: at most THREADS * WORKERS - 1 requests beyond the 40. With
    one tally row or sixteen alike. Every request made is counted at the
    fake server and in the tallies; every other session's input is held
    (not lost: it runs once the budget is raised) or its turn is refused
    with the budget as the reason, before any request."""
    settings.TERRET_MAX_AGENTS = 1000
    profile = AgentProfile.objects.create(
        name="hot",
        roles={"main": "test/model"},
        allow_floor=["*"],
        daily_cost_usd=Decimal(LIMIT_STEPS) * Decimal(str(COST)),
        daily_tokens=None,
    )
    fake_llm.responder = lambda body: Reply(text="ok", usage=USAGE, latency=0.05)
    owner = make_user("owner")
    sessions = [services.create_session(owner, profile) for _ in range(TURNS)]
    ids = [s.id for s in sessions]
    env = {"TERRET_MAX_AGENTS": "1000", "TERRET_SWEEP_SECONDS": "1", "TERRET_TALLY_SHARDS": "16"}
    for n in range(WORKERS):
        start_worker(name=f"hot{n}", concurrency=THREADS, **env)
    for sid in ids:
        services.inject(sid, "go", wake=True)
    wait_for(lambda: _settled(ids)["settled"] == TURNS, timeout=180, what="every session's turn ended or held")

    made = len(fake_llm.requests)
    spent = limits.day_spent(profile.pk)
    assert LIMIT_STEPS <= made <= LIMIT_STEPS + WORKERS * THREADS - 1, made
    assert spent.cost_usd == Decimal(made) * Decimal(str(COST)), "every request counted, once"
    assert spent.steps == made
    completed = Event.objects.filter(session_id__in=ids, kind="turn/end", data__status="completed").count()
    assert completed == made, "a completed turn made one request; no other turn made any"
    refused = [e for sid in ids for e in events(Session(id=sid), "turn/end") if e["status"] != "completed"]
    assert all(e["reason"]["budget"] == "cost_usd" and e["reason"]["scope"] == "profile" for e in refused)
    settled = _settled(ids)
    assert settled["ended"] + settled["held"] == TURNS
    assert settled["held"] > 0
    # The spend is spread over the shards: no row took every step.
    rows = list(UsageDay.objects.filter(profile=profile).values_list("steps", flat=True))
    assert 1 < len(rows) <= 16 and sum(rows) == made and max(rows) < made

    # Held, not lost: raised, every held input runs (the sweep offers it again).
    held = settled["held"]
    edit_profile(profile, daily_cost_usd=Decimal(10))
    wait_for(
        lambda: _settled(ids)["ended"] == TURNS, timeout=120, what="the held inputs' turns, once the budget is raised"
    )
    assert len(fake_llm.requests) == made + held
    assert limits.day_spent(profile.pk).steps == made + held
