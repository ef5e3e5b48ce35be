"""A policy update made in one process is in force at the next tool call of
a turn a worker in another process is running (whose cache already holds the
old policy)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from policies_app import services as policies
from sessions_app import services
from sessions_app.models import AgentProfile, Event
from tests.fakes.fake_llm import Reply
from tests.helpers import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_policy_hot_reload_across_processes(
    start_worker: Any, fake_llm: Any, make_user: Any, tmp_path: Any, settings: Any
) -> None:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(
        name="w", roles={"main": "test/model"}, builtin_tools=["clock.now"], allow_floor=[]
    )
    session = services.create_session(make_user("owner"), profile)
    policies.update_policy(session.id, ["clock.*"], user=session.owner)
    second, third = threading.Event(), threading.Event()
    call = [("clock.now", {})]
    fake_llm.script(
        Reply(tool_calls=call),  # step 1: allowed; the worker caches the session policy
        Reply(text="again", tool_calls=call, hang=second),  # step 2: held while we revoke
        Reply(text="and again", tool_calls=call, hang=third),  # step 3: held while we restore
        Reply(text="done"),
    )
    start_worker(name="w")
    services.run_turn(session.id, "what time is it, three times")
    try:
        wait_for(lambda: len(fake_llm.requests) >= 2)
        policies.update_policy(session.id, ["debug.*"], user=session.owner)  # this process, not the worker's
        second.set()
        wait_for(lambda: len(fake_llm.requests) >= 3)
        policies.update_policy(session.id, ["clock.now"], user=session.owner)
        third.set()
        wait_for(lambda: Event.objects.filter(session=session, kind="turn/end").exists())
    finally:
        second.set()
        third.set()
    results = list(
        Event.objects.filter(session=session, kind="tool/result").order_by("seq").values_list("data", flat=True)
    )
    assert [r["is_error"] for r in results] == [False, True, False]
    assert "session's allow-list" in results[1]["content"]
    assert Event.objects.get(session=session, kind="turn/end").data == {"status": "completed"}
