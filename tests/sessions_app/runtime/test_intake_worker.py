"""Bounded intake under a real worker (issue 27.5): a flood of passive writes
waiting behind a follow-up is taken in over several bounded turns, and every
write reaches the model exactly once, counted at the fake provider: each
write's marker first appears in one request, in order, no request carries
more new input than the bound, and each request is the history plus at most
the bound. (The 30 MB figures, and the memory, are tests/.../test_intake.py.)"""

from __future__ import annotations

import re
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Event
from sessions_app.services import inputs
from tests.fakes.fake_llm import request_size
from tests.helpers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

WRITES = 40
SIZE = 20_000
BOUND = 200_000  # bytes: ten writes a turn
MARK = re.compile(r"<w(\d{3})>")


def write(i: int) -> str:
    mark = f"<w{i:03d}>"
    return mark + "x" * (SIZE - len(mark))


def test_a_passive_flood_reaches_the_model_once_each_over_bounded_turns(
    start_worker: Any, fake_llm: Any, make_user: Any, profile: AgentProfile
) -> None:
    session = services.create_session(make_user(), profile)
    services.run_turn(session.id, "first")  # its wake-up waits for the worker, started below
    for i in range(WRITES):
        services.inject(session.id, write(i), lane="passive")
    follow = services.inject(session.id, "and now?", lane="follow_up")
    assert follow.disposition == "queued"
    start_worker(name="a", TERRET_INTAKE_MAX_BYTES=BOUND)
    wait_for(lambda: inputs.receipt(session.id, follow.seq).disposition == "answered", timeout=90, what="the follow-up")
    requests = fake_llm.requests
    seen: dict[int, int] = {}  # write -> the request that first carried it
    for n, body in enumerate(requests):
        for found in MARK.findall(str(body["messages"])):
            seen.setdefault(int(found), n)
    assert sorted(seen) == list(range(WRITES))  # none missing
    firsts = [seen[i] for i in range(WRITES)]
    assert firsts == sorted(firsts)  # in arrival order
    per_request = [firsts.count(n) for n in range(len(requests))]
    assert max(per_request) * SIZE <= BOUND
    # One request for "first", four of ten writes each, then the follow-up's own.
    assert per_request == [0, 10, 10, 10, 10, 0]
    assert "and now?" in str(requests[-1]["messages"]) and "and now?" not in str(requests[-2]["messages"])
    # Each request is the one before, its reply, and at most the bound of new input.
    for before, after in zip(requests, requests[1:], strict=False):
        assert request_size(after) <= request_size(before) + BOUND + 100
    turns = Event.objects.filter(session=session, kind="turn/start").count()
    assert turns == len(requests) == 6
    placed = Event.objects.filter(session=session, kind="context/injected").values_list("data", flat=True)
    assert len(placed) == WRITES  # each write taken in once
