"""Sessions are unlimited; the cap bounds only what is live (issue 12).

1,000 sessions, each with a turn, through real worker processes with
TERRET_MAX_AGENTS=8: every turn completes, no input is refused, and never
more than 8 agents are live at once, by the registry's own count in the log
and by sampling the Agent table while the turns run."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import Agent, AgentProfile, Event, Session
from tests.fakes.fake_llm import Reply
from tests.helpers import wait_for
from tests.workers import DEFAULT_LEASES

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SESSIONS = 1000
CAP = 8


def test_a_thousand_sessions_run_through_eight_agent_slots(
    start_worker: Any, fake_llm: Any, make_user: Any, settings: Any
) -> None:
    settings.TERRET_MAX_AGENTS = CAP
    seen = [0]

    def respond(body: dict[str, Any]) -> Reply:
        # The first turns hold every slot for a while, so the rest must wait
        # for one (agent/waiting) and be handed freed slots, oldest first.
        seen[0] += 1
        return Reply(text="done", usage=(5, 1, None), latency=1.5 if seen[0] <= CAP else 0.02)

    fake_llm.responder = respond
    profile = AgentProfile.objects.create(name="many", roles={"main": "test/model"}, allow_floor=["*"])
    owner = make_user()
    sessions = [Session(owner=owner, profile=profile) for _ in range(SESSIONS)]
    Session.objects.bulk_create(sessions)
    for worker in ("a", "b"):
        # Default lease and sweep settings: slots are handed on by the turns
        # that free them, not found by a sweep.
        start_worker(name=worker, concurrency=8, TERRET_MAX_AGENTS=str(CAP), **DEFAULT_LEASES)

    peak = [0]
    done = threading.Event()

    def sample() -> None:
        from django.db import connection

        try:
            while not done.is_set():
                peak[0] = max(peak[0], Agent.objects.count())
                done.wait(0.02)
        finally:
            connection.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    receipts = [services.inject(s.id, f"hello {i}", wake=True) for i, s in enumerate(sessions)]
    assert {r.disposition for r in receipts} == {"started"}  # accepted, none refused

    def completed() -> int:
        return Event.objects.filter(kind="turn/end", data__status="completed").count()

    wait_for(lambda: completed() == SESSIONS, timeout=240, what=f"{SESSIONS} completed turns")
    done.set()
    sampler.join(5)
    assert len(fake_llm.requests) == SESSIONS  # each turn ran once
    live = list(Event.objects.filter(kind="agent/spawned").values_list("data__live", flat=True))
    assert len(live) >= SESSIONS and max(live) <= CAP
    assert 0 < peak[0] <= CAP
    assert Event.objects.filter(kind="agent/waiting").exists()  # the cap was really in the way
    assert Event.objects.filter(kind="agent/disposed", data__reason="evicted").count() >= SESSIONS - CAP
