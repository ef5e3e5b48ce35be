"""Budgets that stop spending: checked before every turn and every model
call, against the log's running totals, at the session, the profile's UTC
day and the installation's UTC day; input that arrives while a budget is
exhausted is held, and runs once the budget allows. Model requests are
counted at the fake server: a budget that fires means no request is made."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db.models import F

from sessions_app import log, services
from sessions_app.models import AgentProfile, Event, Session, UsageDay
from sessions_app.runtime import sweep
from sessions_app.runtime.drive import drive
from sessions_app.services.budgets import budget_of, set_budget
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for

NO_LIMIT = {"cost_usd": None, "tokens": None, "steps": None, "turns": None}
USAGE = (10, 5, 0.001)  # 15 tokens and $0.001 a request


def limit(**values: Any) -> dict[str, Any]:
    return {**NO_LIMIT, **values}


def requests(fake: Any) -> int:
    return len(fake.requests)


def last_end(session: Session) -> dict[str, Any]:
    return events(session, "turn/end")[-1]


def two_steps() -> list[Reply]:
    return [Reply(tool_calls=[("debug.noop", {})], usage=USAGE), Reply(text="done", usage=USAGE)]


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="budgeted", roles={"main": "test/model"}, builtin_tools=["debug.noop", "debug.sleep"], allow_floor=["*"]
    )


# ---------------------------------------------------------------- in-process, each kind


pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.usefixtures("manual_worker")
@pytest.mark.parametrize(
    ("budget", "value", "spent"),
    [("cost_usd", 0.002, 0.002), ("tokens", 30, 30), ("steps", 2, 2), ("turns", 1, 2)],
)
def test_each_budget_at_a_turns_start_rejects_it_with_the_reason(
    budget: str, value: Any, spent: Any, fake_llm: Any, session: Session
) -> None:
    """One two-step turn spends $0.002, 30 tokens, 2 steps, 1 turn; a turn
    opened after that, under a budget of exactly that, is rejected before
    any model request, with which budget, its limit and the spend (for
    turns, the spend counts the turn being refused: 2 of 1)."""
    fake_llm.script(*two_steps())
    services.run_turn(session.id, "first")
    assert drive(session.id) == "ended"
    set_budget(session.id, limit(**{budget: value}), by="owner")
    services.run_turn(session.id, "second")  # opened anyway: the runner's check decides
    assert drive(session.id) == "ended"
    end = last_end(session)
    assert end["status"] == "rejected"
    assert end["reason"] == {"budget": budget, "scope": "session", "limit": value, "spent": spent}
    assert "budget is exhausted" in end["error"]
    assert requests(fake_llm) == 2, "no model request for the rejected turn"


@pytest.mark.usefixtures("manual_worker")
@pytest.mark.parametrize(("budget", "value"), [("cost_usd", 0.001), ("tokens", 15), ("steps", 1)])
def test_each_budget_between_steps_fails_the_turn_with_the_reason(
    budget: str, value: Any, fake_llm: Any, session: Session
) -> None:
    fake_llm.script(*two_steps())
    set_budget(session.id, limit(**{budget: value}), by="owner")
    services.run_turn(session.id, "go")
    assert drive(session.id) == "ended"
    end = last_end(session)
    assert end["status"] == "failed" and end["reason"]["budget"] == budget and end["reason"]["scope"] == "session"
    assert requests(fake_llm) == 1, "the second step's request is never made"
    assert [e["step"] for e in events(session, "step/end")] == [1], "no step opened past the budget"
    (result,) = events(session, "tool/result")  # the first step's call got its result before the check
    assert result["is_error"] is False


@pytest.mark.usefixtures("manual_worker")
def test_a_turns_budget_lowered_mid_turn_stops_the_next_step(fake_llm: Any, session: Session) -> None:
    """A budget set while a step's model call runs is in force once the
    turn's next commit shows it: here the commit before its tool runs, so
    the next step's check stops it."""

    def lower_then_call(body: dict[str, Any]) -> Reply:
        if not any(m.get("role") == "tool" for m in body["messages"]):
            set_budget(session.id, limit(turns=0), by="staff")
            return Reply(tool_calls=[("debug.sleep", {"seconds": 0})], usage=USAGE)
        return Reply(text="never", usage=USAGE)

    fake_llm.responder = lower_then_call
    services.run_turn(session.id, "go")
    assert drive(session.id) == "ended"
    end = last_end(session)
    assert (end["status"], end["reason"]) == ("failed", {"budget": "turns", "scope": "session", "limit": 0, "spent": 1})
    assert requests(fake_llm) == 1


@pytest.mark.usefixtures("manual_worker")
def test_unpriced_spend_under_a_cost_budget_stops_it(fake_llm: Any, session: Session) -> None:
    """The rule: a cost budget cannot be enforced on unpriced requests, and
    unpriced is never $0, so the first unpriced entry exhausts it."""
    fake_llm.script(Reply(tool_calls=[("debug.noop", {})], usage=(10, 5, None)), Reply(text="never"))
    set_budget(session.id, limit(cost_usd=100), by="owner")
    services.run_turn(session.id, "go")
    assert drive(session.id) == "ended"
    end = last_end(session)
    assert end["status"] == "failed"
    assert end["reason"] == {"budget": "cost_usd", "scope": "session", "limit": 100.0, "spent": 0.0, "unpriced": 1}
    assert "cannot be enforced" in end["error"] and "never counted as $0" in end["error"]
    assert requests(fake_llm) == 1
    receipt = services.inject(session.id, "more", wake=True)
    assert receipt.disposition == "held" and "cannot be enforced" in (receipt.held_reason or "")
    # Without a cost limit the same spend runs.
    set_budget(session.id, NO_LIMIT, by="owner")
    fake_llm.script(Reply(text="priced or not, no cost budget"))
    assert drive(session.id) == "ended" and last_end(session)["status"] == "completed"


@pytest.mark.usefixtures("manual_worker")
def test_held_input_runs_when_the_budget_is_raised(fake_llm: Any, session: Session) -> None:
    fake_llm.script(Reply(text="one", usage=USAGE), Reply(text="two", usage=USAGE))
    set_budget(session.id, limit(turns=1), by="owner")
    assert services.inject(session.id, "first", wake=True).disposition == "started"
    assert drive(session.id) == "ended"
    receipt = services.inject(session.id, "second", wake=True)
    assert receipt.disposition == "held" and receipt.turn_seq is None
    assert receipt.held_reason == "the session's turn budget is exhausted: 1 of 1"
    (held,) = events(session, "input/held")
    assert held["source_seq"] == receipt.seq and held["reason"]["budget"] == "turns"
    assert drive(session.id) == "idle", "held: no turn while the budget is exhausted"
    assert Session.objects.get(id=session.id).held_seq == receipt.seq
    assert budget_of(session.id)["exhausted"]["budget"] == "turns"

    set_budget(session.id, limit(turns=2), by="owner")
    assert drive(session.id) == "ended"
    assert last_end(session)["status"] == "completed"
    assert events(session, "user/message")[-1]["text"] == "second"
    assert Session.objects.get(id=session.id).held_seq is None
    assert requests(fake_llm) == 2


@pytest.mark.usefixtures("manual_worker")
def test_a_profiles_daily_budget_rolls_over_at_midnight_utc(
    fake_llm: Any, session: Session, profile: AgentProfile
) -> None:
    profile.daily_turns = 1
    profile.save()
    fake_llm.script(Reply(text="today", usage=USAGE), Reply(text="tomorrow", usage=USAGE))
    services.inject(session.id, "first", wake=True)
    assert drive(session.id) == "ended"
    receipt = services.inject(session.id, "second", wake=True)
    assert (
        receipt.disposition == "held" and receipt.held_reason == "the profile's daily turn budget is exhausted: 1 of 1"
    )
    assert str(session.id) not in sweep.held() or drive(session.id) == "idle"

    # Midnight: today's row becomes yesterday's; the sweep offers the held input again.
    UsageDay.objects.filter(profile=profile).update(day=F("day") - dt.timedelta(days=1))
    sweep._woken.clear()
    assert str(session.id) in sweep.held()
    assert drive(session.id) == "ended"
    assert last_end(session)["status"] == "completed"
    assert events(session, "user/message")[-1]["text"] == "second"
    assert requests(fake_llm) == 2


@pytest.mark.usefixtures("manual_worker")
def test_a_raised_daily_budget_lets_held_input_run_on_a_pinned_version(
    fake_llm: Any, session: Session, profile: AgentProfile
) -> None:
    """A profile's daily budget is one pool for all its sessions, checked
    against the live row by admission and by every step alike: a session
    pinned to the version that had the lower limit runs its held input once
    the limit is raised (its turn is not refused at its first step)."""
    profile.upgrade_policy, profile.daily_cost_usd = "pinned", 0.001
    profile.save()
    fake_llm.script(Reply(text="one", usage=USAGE), Reply(text="two", usage=USAGE))
    services.inject(session.id, "first", wake=True)
    assert drive(session.id) == "ended"
    pinned = Session.objects.get(id=session.id).agent_version
    assert services.inject(session.id, "second", wake=True).disposition == "held"

    profile.daily_cost_usd = 1
    profile.save()  # a new version: the session stays on its own
    assert drive(session.id) == "ended"
    assert last_end(session)["status"] == "completed"
    assert events(session, "user/message")[-1]["text"] == "second"
    assert Session.objects.get(id=session.id).agent_version == pinned
    assert requests(fake_llm) == 2


@pytest.mark.usefixtures("manual_worker")
def test_the_global_daily_budget_counts_every_session(
    fake_llm: Any, owner: Any, profile: AgentProfile, settings: Any
) -> None:
    settings.TERRET_DAILY_STEPS = 2
    a = services.create_session(owner, profile)
    b = services.create_session(owner, profile)
    fake_llm.script(Reply(text="a", usage=USAGE), Reply(text="b", usage=USAGE), Reply(text="never"))
    for s in (a, b):
        services.inject(s.id, "go", wake=True)
        assert drive(s.id) == "ended"
    receipt = services.inject(a.id, "again", wake=True)
    assert receipt.disposition == "held"
    assert receipt.held_reason == "the daily global step budget is exhausted: 2 of 2"
    assert requests(fake_llm) == 2


# ---------------------------------------------------------------- real workers


@pytest.mark.worker
def test_under_a_worker_a_budget_stops_mid_turn_and_held_input_runs_when_raised(
    start_worker: Any, fake_llm: Any, make_user: Any, profile: AgentProfile
) -> None:
    session = services.create_session(make_user(), profile)
    fake_llm.script(
        Reply(tool_calls=[("debug.noop", {})], usage=USAGE),  # step 1 of turn 1
        Reply(text="after the raise", usage=USAGE),  # turn 2, once raised
    )
    set_budget(session.id, limit(steps=1), by="owner")
    start_worker(name="a")
    services.inject(session.id, "go", wake=True)
    wait_for(lambda: events(session, "turn/end"), what="turn 1's end")
    end = last_end(session)
    assert end["status"] == "failed" and end["reason"]["budget"] == "steps"
    held = services.inject(session.id, "and now?", wake=True)
    assert held.disposition == "held"
    assert requests(fake_llm) == 1
    set_budget(session.id, limit(steps=5), by="owner")  # wakes the held input on commit
    wait_for(lambda: len(events(session, "turn/end")) == 2, what="the held input's turn")
    assert last_end(session) == {"status": "completed"}
    assert requests(fake_llm) == 2
    assert Event.objects.filter(session=session, kind="turn/start").count() == 2


@pytest.mark.worker
def test_under_a_worker_a_daily_budget_lets_held_input_run_on_a_new_day(
    start_worker: Any, fake_llm: Any, make_user: Any, profile: AgentProfile
) -> None:
    profile.daily_tokens = 15
    profile.save()
    session = services.create_session(make_user(), profile)
    fake_llm.script(Reply(text="one", usage=USAGE), Reply(text="two", usage=USAGE))
    start_worker(name="a")
    services.inject(session.id, "first", wake=True)
    wait_for(lambda: events(session, "turn/end"), what="turn 1")
    held = services.inject(session.id, "second", wake=True)
    assert held.disposition == "held"
    UsageDay.objects.filter(profile=profile).update(day=F("day") - dt.timedelta(days=1))  # midnight UTC
    wait_for(lambda: len(events(session, "turn/end")) == 2, timeout=30, what="the worker's sweep running it")
    assert last_end(session) == {"status": "completed"}
    assert requests(fake_llm) == 2


@pytest.mark.worker
@pytest.mark.parametrize(
    ("budget", "start", "mid"),
    [
        ("cost_usd", 0.002, 0.001),
        ("tokens", 30, 15),
        ("steps", 2, 1),
        ("turns", 1, None),  # turns do not grow within a turn: checked at its start only
    ],
)
def test_under_a_worker_each_budget_at_a_turns_start_and_between_steps(
    budget: str, start: Any, mid: Any, start_worker: Any, fake_llm: Any, make_user: Any, profile: AgentProfile
) -> None:
    """A real worker process: a two-step turn spends $0.002, 30 tokens, 2
    steps, 1 turn. Under a budget of exactly that, the next turn is rejected
    before any model request; under a budget of one step's worth, a turn
    fails between its steps. Requests are counted at the fake server."""
    session = services.create_session(make_user(), profile)
    replies = two_steps() + (two_steps()[:1] if mid is not None else [])
    fake_llm.script(*replies)
    start_worker(name="a")
    services.inject(session.id, "first", wake=True)
    wait_for(lambda: events(session, "turn/end"), what="the first turn")
    assert last_end(session) == {"status": "completed"}
    set_budget(session.id, limit(**{budget: start}), by="owner")
    services.run_turn(session.id, "second")  # opened, not held: the worker's check rejects it
    wait_for(lambda: len(events(session, "turn/end")) == 2, what="the second turn's end")
    end = last_end(session)
    assert (end["status"], end["reason"]["budget"], end["reason"]["scope"]) == ("rejected", budget, "session")
    assert requests(fake_llm) == 2
    if mid is None:
        return
    other = services.create_session(make_user(), profile)
    set_budget(other.id, limit(**{budget: mid}), by="owner")
    services.inject(other.id, "go", wake=True)
    wait_for(lambda: events(other, "turn/end"), what="the budgeted turn")
    end = last_end(other)
    assert (end["status"], end["reason"]["budget"]) == ("failed", budget)
    assert requests(fake_llm) == 3, "the second step's request is never made"


@pytest.mark.usefixtures("manual_worker")
def test_utility_requests_count_against_the_budget(fake_llm: Any, session: Session) -> None:
    """A titler's or summarizer's spend (usage/recorded) counts like a step's."""
    usage = {"prompt_tokens": 20, "completion_tokens": 5, "cost": 0.01}
    log.append(session.id, "usage/recorded", {"purpose": "title", "model": "x/t", "usage": usage})
    set_budget(session.id, limit(tokens=25), by="owner")
    receipt = services.inject(session.id, "hello", wake=True)
    assert receipt.disposition == "held"
    assert receipt.held_reason == "the session's token budget is exhausted: 25 of 25"
    assert requests(fake_llm) == 0
