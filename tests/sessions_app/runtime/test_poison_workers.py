"""Poison turns end against real worker processes, with a bounded number of
model requests counted at the model server (issue 12). The same rules are
checked step by step in test_turns_end.py; here a Celery worker and its
sweep do the driving, as in production."""

from __future__ import annotations

import time
from typing import Any

import pytest

from approvals_app import services as approvals
from sessions_app import log, services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime import documents
from tests.fakes.fake_llm import Reply
from tests.helpers import events, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def turn_end(session: Session) -> dict[str, Any] | None:
    ends = events(session, "turn/end")
    return ends[-1] if ends else None


def requests_for(fake_llm: Any, marker: str) -> int:
    return sum(1 for body in fake_llm.requests if marker in str(body.get("messages")))


def test_poison_turns_end_with_bounded_model_requests(
    start_worker: Any, fake_llm: Any, make_user: Any, make_reviewer: Any, tmp_path: Any, settings: Any
) -> None:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    owner = make_user()
    good = AgentProfile.objects.create(
        name="good", roles={"main": "test/model"}, builtin_tools=["workspace.read", "workspace.write"],
        allow_floor=["*"], approvals={"workspace.write": "always"},
    )  # fmt: skip
    broken = AgentProfile.objects.create(name="broken", roles={"main": "test/model"}, builtin_tools=["no.such"])

    def respond(body: dict[str, Any]) -> Reply:
        text = str(body.get("messages"))
        if "FLAKY" in text:
            return Reply(status=500, error_message="upstream down")
        if "BIGREAD" in text:
            return (
                Reply(text="done") if "'tool'" in text else Reply(tool_calls=[("workspace.read", {"path": "big.txt"})])
            )
        if "PARK400" in text:
            if "'tool'" in text:
                return Reply(status=400, error_message="context length exceeded: 9999 > 8192")
            return Reply(tool_calls=[("workspace.write", {"path": "a.txt", "content": "v"})])
        return Reply(text="ok")

    fake_llm.responder = respond
    start_worker(
        name="p", TERRET_RESUME_BACKOFF_SECONDS="0.2", TERRET_RESUME_ATTEMPTS="3", TERRET_LLM_RETRIES="1",
        TERRET_LLM_BACKOFF_BASE="0", TERRET_MAX_TOOL_RESULT_CHARS="10000000", TERRET_MAX_EVENT_BYTES="65536",
    )  # fmt: skip

    unknown_tool = services.create_session(owner, broken)
    services.inject(unknown_tool.id, "UNKNOWN hello", wake=True)

    big = services.create_session(owner, good)
    documents.write(big.id, "big.txt", b"x" * 200_000)  # the session's files live in its journal
    services.inject(big.id, "BIGREAD please", wake=True)

    parked = services.create_session(owner, good)
    services.inject(parked.id, "PARK400 write", wake=True)

    flaky = services.create_session(owner, good)
    services.spawn_agent(flaky, good)
    for kind, data in (
        ("turn/start", {}),
        ("user/message", {"text": "FLAKY"}),
        ("step/start", {"step": 1, "model": "m"}),
    ):
        log.append(flaky.id, kind, data)  # what a worker killed mid-stream leaves
    services.inject(flaky.id, "are you back?", wake=True)

    wait_for(lambda: events(parked, "approval/requested"), what="the park")
    (asked,) = events(parked, "approval/requested")
    approvals.decide(parked.id, asked["call_id"], "approve", user=make_reviewer("rev"))

    wait_for(lambda: events(unknown_tool, "turn/blocked"), timeout=20, what="the unknown built-in's turn/blocked")
    wait_for(lambda: turn_end(big) is not None, timeout=20, what="the refused result's turn/end")
    wait_for(lambda: events(parked, "turn/blocked"), timeout=20, what="the 400's turn/blocked")
    wait_for(lambda: Session.objects.get(id=flaky.id).status == "blocked", timeout=30, what="the flaky session blocked")

    # A built-in the code lacks is a missing definition: blocked, not failed, and nothing asked of the model.
    (missing,) = events(unknown_tool, "turn/blocked")
    assert (missing["code"], missing["what"]) == ("definition_missing", "tool:no.such")
    assert turn_end(unknown_tool) is None and requests_for(fake_llm, "UNKNOWN") == 0
    end = turn_end(big)
    assert end is not None and end["status"] == "failed" and "larger than 65536 bytes" in end["error"]
    assert requests_for(fake_llm, "BIGREAD") == 1
    # A context-length refusal that compaction cannot get under blocks the
    # turn for an operator (code context_overflow); it never loops.
    (overflow,) = events(parked, "turn/blocked")
    assert overflow["code"] == "context_overflow" and turn_end(parked) is None
    assert requests_for(fake_llm, "PARK400") == 2
    (blocked,) = events(flaky, "turn/blocked")
    assert blocked["attempts"] == 3 and "upstream down" in blocked["reason"]
    # Nothing retries a blocked session by itself: the sweep runs every 0.5 s here.
    flaky_requests = requests_for(fake_llm, "FLAKY")
    assert flaky_requests == 3 * 2  # attempts x (1 + retries)
    time.sleep(3)
    assert requests_for(fake_llm, "FLAKY") == flaky_requests
    assert not Event.objects.filter(session=flaky, kind="turn/end").exists()
    assert len(events(unknown_tool, "turn/blocked")) == 1
    # The operator's retry is one more attempt, through the worker.
    services.retry(flaky.id, by="ops")
    wait_for(lambda: len(events(flaky, "turn/blocked")) == 2, timeout=20, what="blocked again")
    assert requests_for(fake_llm, "FLAKY") == flaky_requests + 2
