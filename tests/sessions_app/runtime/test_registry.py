"""The agent registry across sessions: spawn on demand, the cap, eviction,
waiting for a slot, idle disposal and respawn (runtime/registry.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from sessions_app import log, services
from sessions_app.errors import AgentBusy
from sessions_app.log.reads import waiting_info
from sessions_app.models import Agent, AgentProfile, Session
from sessions_app.runtime import registry
from sessions_app.runtime.drive import drive
from sessions_app.runtime.sweep import sweep_round
from tests import workers
from tests.fakes.fake_llm import Reply
from tests.helpers import events, kinds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def fresh(owner: Any, profile: AgentProfile) -> Any:
    """Sessions as users create them: no agent until their first stimulus."""

    def make() -> Session:
        return services.create_session(owner, profile)

    return make


def test_a_new_session_holds_no_agent_until_its_first_turn(fake_llm: Any, fresh: Any) -> None:
    session = fresh()
    assert not Agent.objects.filter(session=session).exists()
    fake_llm.responder = lambda body: Reply(text="hi")
    services.inject(session.id, "hello", wake=True)
    assert drive(session.id) == "ended"
    assert kinds(session)[:3] == ["turn/start", "user/message", "agent/spawned"]
    (spawned,) = events(session, "agent/spawned")
    assert spawned == {"agent_id": f"t-{session.id.hex[:12]}", "profile": "t", "live": 1}


def test_sessions_are_unlimited_and_idle_agents_are_evicted_to_make_room(
    fake_llm: Any, fresh: Any, settings: Any
) -> None:
    settings.TERRET_MAX_AGENTS = 2
    fake_llm.responder = lambda body: Reply(text="ok")
    sessions = [fresh() for _ in range(5)]
    for session in sessions:
        services.inject(session.id, "go", wake=True)
        assert drive(session.id) == "ended"
        assert Agent.objects.count() <= 2
    assert all(events(s, "turn/end") == [{"status": "completed"}] for s in sessions)
    # the least recently active idle agents made room, each disposal logged
    evicted = [s for s in sessions if events(s, "agent/disposed")]
    assert len(evicted) == 3 and all(events(s, "agent/disposed")[0]["reason"] == "evicted" for s in evicted)
    # and the first one comes back transparently, with the same id
    first = sessions[0]
    services.inject(first.id, "again", wake=True)
    assert drive(first.id) == "ended"
    assert [e["agent_id"] for e in events(first, "agent/spawned")] == [f"t-{first.id.hex[:12]}"] * 2


def test_when_every_live_agent_is_busy_input_waits_durably_and_runs_when_a_slot_frees(
    fake_llm: Any, fresh: Any, settings: Any
) -> None:
    settings.TERRET_MAX_AGENTS = 1
    busy, waiting = fresh(), fresh()
    registry.spawn(busy, busy.profile)  # type: ignore[arg-type]
    log.append(busy.id, "turn/start", {})  # mid-turn: not evictable
    receipt = services.inject(waiting.id, "my turn?", wake=True)
    assert receipt.disposition == "started"  # accepted, durably: never a 429
    assert drive(waiting.id) == "waiting"
    assert drive(waiting.id) == "waiting"  # a second wake-up logs nothing new
    (note,) = events(waiting, "agent/waiting")
    assert note["live"] == 1 and "registry is full" in note["reason"]
    waiting.refresh_from_db()
    assert waiting.status == "running" and waiting_info(waiting) is not None
    assert registry.offer_slots() == []  # still no room
    log.append(busy.id, "turn/end", {"status": "completed"})
    assert registry.offer_slots() == [str(waiting.id)]
    assert registry.offer_slots() == []  # the slot is taken: no second waker gets it
    fake_llm.responder = lambda body: Reply(text="now")
    assert drive(waiting.id) == "ended"
    waiting.refresh_from_db()
    assert waiting_info(waiting) is None and events(waiting, "turn/end") == [{"status": "completed"}]
    assert Agent.objects.count() == 1


class AfterTurn:
    """What the after-turn hooks saw: the facts they got, every has_waiting()
    query and the wake-ups post_turn sent."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.facts: list[Any] = []
        self.has_waiting: list[bool] = []
        self.woken: list[str] = []

    def on(self) -> None:
        """From now on drive() runs the hooks as a worker does. Call it after
        the test's own input: its wake-ups would start the in-process pool."""
        self.settings.TERRET_WORKER = "inprocess"


@pytest.fixture
def after_turn(monkeypatch: Any, settings: Any) -> AfterTurn:
    from types import SimpleNamespace

    from sessions_app.runtime import hooks
    from sessions_app.services import post_turn

    seen = AfterTurn(settings)
    real_run, real_has_waiting = hooks.run_after_turn, registry.has_waiting

    def run_after_turn(session_id: Any, facts: Any) -> None:
        seen.facts.append(facts)
        real_run(session_id, facts)

    def has_waiting() -> bool:
        seen.has_waiting.append(True)
        return real_has_waiting()

    monkeypatch.setattr(hooks, "run_after_turn", run_after_turn)
    monkeypatch.setattr(registry, "has_waiting", has_waiting)
    monkeypatch.setattr(post_turn, "dispatch", SimpleNamespace(wake=lambda sid: seen.woken.append(str(sid))))
    return seen


def test_a_turns_end_with_nobody_waiting_asks_no_query_for_waiting_sessions(
    fake_llm: Any, fresh: Any, after_turn: AfterTurn
) -> None:
    """The turn's releasing commit said nobody waits for a slot
    (Workload.slots_wanted): post_turn does not ask has_waiting() again."""
    session = fresh()
    fake_llm.responder = lambda body: Reply(text="hi")
    services.inject(session.id, "hello", wake=True)
    after_turn.on()
    assert drive(session.id) == "ended"
    (facts,) = after_turn.facts
    assert facts.slots_wanted is False
    assert after_turn.has_waiting == [] and after_turn.woken == []


def test_a_turns_end_hands_its_freed_slot_to_a_session_waiting_for_one(
    fake_llm: Any, fresh: Any, settings: Any, after_turn: AfterTurn
) -> None:
    """At the cap, a session waits while the only agent is mid-turn; that
    turn's releasing commit sees it waiting, and its end hands the slot on."""
    settings.TERRET_MAX_AGENTS = 1
    busy, waiting = fresh(), fresh()
    registry.spawn(busy, busy.profile)  # type: ignore[arg-type]
    services.run_turn(busy.id, "go")  # open, not yet driven: not evictable
    services.inject(waiting.id, "my turn?", wake=True)
    after_turn.on()
    assert drive(waiting.id) == "waiting"
    assert after_turn.facts == []  # no turn ended
    fake_llm.responder = lambda body: Reply(text="done")
    assert drive(busy.id) == "ended"
    (facts,) = after_turn.facts
    assert facts.slots_wanted is True
    assert len(after_turn.has_waiting) == 1  # offer_slots checked, as before
    assert after_turn.woken == [str(waiting.id)]
    assert events(busy, "agent/disposed") == [{"agent_id": f"t-{busy.id.hex[:12]}", "reason": "evicted"}]
    assert Agent.objects.filter(session=waiting).exists() and Agent.objects.count() == 1
    assert drive(waiting.id) == "ended"
    assert events(waiting, "turn/end") == [{"status": "completed"}]
    assert after_turn.facts[-1].slots_wanted is False  # nobody waits any more


def test_idle_agents_are_disposed_after_the_idle_period_and_respawned(fake_llm: Any, fresh: Any, settings: Any) -> None:
    session = fresh()
    fake_llm.responder = lambda body: Reply(text="ok")
    services.inject(session.id, "one", wake=True)
    drive(session.id)
    settings.TERRET_AGENT_IDLE_SECONDS = 3600
    assert registry.reap_idle() == 0
    Session.objects.filter(id=session.id).update(last_event_at=session.created_at.replace(year=2000))
    assert registry.reap_idle() == 1
    assert events(session, "agent/disposed") == [{"agent_id": f"t-{session.id.hex[:12]}", "reason": "idle"}]
    services.inject(session.id, "two", wake=True)
    assert drive(session.id) == "ended"
    assert len(events(session, "agent/spawned")) == 2


def test_dispose_only_when_idle(fresh: Any) -> None:
    session = fresh()
    agent = registry.spawn(session, session.profile)  # type: ignore[arg-type]
    log.append(session.id, "input/queued", {"text": "pending", "wake": False})
    with pytest.raises(AgentBusy):
        services.dispose_agent(agent.agent_id, by="ops")
    assert Agent.objects.filter(pk=agent.pk).exists()


class FrozenHolder:
    """Another process's connection that takes the registry lock inside a
    transaction and then stops before its commit, as a worker stopped
    (SIGSTOP, a frozen VM) between its lock and its commit leaves it."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def hold(self) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", [registry.REGISTRY_LOCK])

    def resume(self) -> None:
        self.conn.commit()


@pytest.fixture
def frozen_holder() -> Iterator[FrozenHolder]:
    if connection.vendor != "postgresql":
        pytest.skip("the registry lock is PostgreSQL's; SQLite's IMMEDIATE transactions serialize writers")
    with psycopg.connect(workers.test_database_url()) as conn:
        holder = FrozenHolder(conn)
        try:
            yield holder
        finally:
            holder.resume()


def test_the_sweep_goes_on_past_a_registry_lock_a_stopped_process_holds(
    fake_llm: Any, fresh: Any, settings: Any, frozen_holder: FrozenHolder
) -> None:
    settings.TERRET_MAX_AGENTS = 1
    settings.TERRET_AGENT_IDLE_SECONDS = 0
    busy, waiting, stray = fresh(), fresh(), fresh()
    registry.spawn(busy, busy.profile)  # type: ignore[arg-type]
    log.append(busy.id, "turn/start", {})
    services.inject(waiting.id, "my turn?", wake=True)
    assert drive(waiting.id) == "waiting"
    log.append(busy.id, "turn/end", {"status": "completed"})  # its agent is idle now: reapable, evictable
    services.inject(stray.id, "nobody drives me", wake=True)  # an open turn no wake-up reached
    frozen_holder.hold()

    woken: list[str] = []
    round_ = threading.Thread(target=sweep_round, kwargs={"at_start": True, "wake": woken.append}, daemon=True)
    round_.start()
    round_.join(timeout=10)
    try:
        assert not round_.is_alive(), "the sweep round waited on the registry lock"
        assert woken == [str(stray.id)]  # the unowned turn is woken; no slot was offered
        assert Agent.objects.filter(session=busy).exists()  # nothing reaped under another's lock
    finally:
        frozen_holder.resume()
        round_.join(timeout=10)

    woken.clear()
    sweep_round(at_start=False, wake=woken.append)
    assert events(busy, "agent/disposed") == [{"agent_id": f"t-{busy.id.hex[:12]}", "reason": "idle"}]
    assert woken == [str(waiting.id)]  # the freed slot, offered the same round
    assert Agent.objects.filter(session=waiting).exists()
