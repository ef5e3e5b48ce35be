"""Issue 29's done-when line, against real worker processes: editing a
profile while a turn is parked on an approval does not change that turn;
the next turn opens on the new version, or stays on the old one under `pinned`."""

from __future__ import annotations

from typing import Any

import pytest

from approvals_app import services as approvals
from approvals_app.selectors import pending
from sessions_app import services
from sessions_app.models import AgentProfile, Event, Session
from tests.fakes.fake_llm import Reply
from tests.helpers import document_text, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def data(session: Session, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(session=session, kind=kind).order_by("seq").values_list("data", flat=True))


def system_prompt(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"]) if request["messages"][0]["role"] == "system" else ""


@pytest.mark.parametrize("policy", ["next_turn", "pinned"])
def test_an_edit_while_parked_does_not_reach_the_parked_turn(
    policy: str, start_worker: Any, fake_llm: Any, make_user: Any, make_reviewer: Any, settings: Any, tmp_path: Any
) -> None:
    settings.TERRET_WORKSPACE_ROOT = tmp_path  # the workers inherit it
    profile = AgentProfile.objects.create(
        name="w",
        roles={"main": "test/model"},
        builtin_tools=["workspace.write"],
        approvals={"workspace.write": "always"},
        allow_floor=["*"],
        system_prompt="prompt of version one",
        upgrade_policy=policy,
    )
    fake_llm.script(
        Reply(tool_calls=[("workspace.write", {"path": "out.txt", "content": "x"})]),
        Reply(text="written"),
        Reply(text="second turn"),
    )
    session = services.create_session(make_user("owner"), profile)
    first = start_worker(name="first")
    services.run_turn(session.id, "write the file")
    wait_for(lambda: pending(session.id), 60, "the call to park")
    first.kill()  # the parked turn goes on in a fresh process, which never saw version 1 before

    # The edit drops the parked call's approval and changes the prompt: v2.
    profile.system_prompt = "prompt of version two"
    profile.approvals = {}
    profile.save()
    assert profile.versions.count() == 2

    [call] = pending(session.id)
    approvals.decide(session.id, call.call_id, "approve", user=make_reviewer("rev"), request_seq=call.seq)
    start_worker(name="second")
    wait_for(lambda: data(session, "turn/end"), 60, "the approved turn to end")
    assert document_text(session.id, "out.txt") == "x"
    # The model call after the approved result ran under the version that asked.
    assert [system_prompt(r) for r in fake_llm.requests] == ["prompt of version one"] * 2

    services.run_turn(session.id, "again")
    wait_for(lambda: len(data(session, "turn/end")) == 2, 60, "the next turn to end")
    opened = [e["version"]["number"] for e in data(session, "turn/start")]
    if policy == "next_turn":
        assert opened == [1, 2]
        (moved,) = data(session, "session/upgraded")
        assert (moved["from"]["number"], moved["to"]["number"], moved["by"]) == (1, 2, "policy")
        assert system_prompt(fake_llm.requests[2]) == "prompt of version two"
    else:
        assert opened == [1, 1]
        assert data(session, "session/upgraded") == []
        assert system_prompt(fake_llm.requests[2]) == "prompt of version one"
    assert [e["status"] for e in data(session, "turn/end")] == ["completed", "completed"]
