"""A stall under a real worker on PostgreSQL (issue 31.4, done when): the
model's stream trickles SSE keep-alive comments (`: keep-alive`) and no
tokens for longer than TERRET_STALL_SECONDS; the session shows
`stalled_since`, /ops/ and /metrics show it stalled, and the worker's sweep
appends turn/stalled exactly once. When the tokens resume, stalled_since
clears while the turn still streams, and the turn completes. With the
profile's `on_stall: cancel` the stalled turn is cancelled instead."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pytest
from django.test import Client

from sessions_app import services
from sessions_app.models import AgentProfile, Session
from tests.fakes.fake_llm import Reply
from tests.helpers import events, kinds, wait_for
from tests.sessions_app.apiutil import bearer, call, session_url, token_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

STALL = 1.5  # seconds; the workers' lease is 2 s (renewed every ~0.7 s), their sweep 0.5 s
WORDS = 50  # after the resume, at CHUNK_DELAY each: several lease renewals of streaming


def detail(client: Client, session: Session, auth: dict[str, str]) -> dict[str, Any]:
    response = call(client, "GET", session_url(session), **auth)
    assert response.status_code == 200, response.content
    return response.data


def ended(session: Session) -> str | None:
    found = events(session, "turn/end")
    return found[-1]["status"] if found else None


def test_a_turn_trickling_keep_alives_shows_stalled_once_and_clears_when_tokens_resume(
    start_worker: Any, fake_llm: Any, owner: Any, profile: AgentProfile, make_user: Any, client: Client
) -> None:
    resume = threading.Event()
    text = " ".join(f"w{i}" for i in range(WORDS))
    # Chunk 0 is the role, chunk 1 the first word: then only keep-alives until `resume`.
    fake_llm.script(Reply(text=text, keepalive_after=2, keepalive_until=resume, chunk_delay=0.1))
    session = services.create_session(owner, profile)
    start_worker(TERRET_STALL_SECONDS=STALL)
    auth = bearer(token_for(owner))
    services.run_turn(session.id, "hello")

    body = wait_for(lambda: (b := detail(client, session, auth))["stalled_since"] and b, timeout=60, what="a stall")
    assert body["status"] == "running"
    assert body["progress"]["phase"] == "model"
    assert body["progress"]["streamed_tokens"] == 1  # the first word, then keep-alives only
    since = datetime.fromisoformat(body["stalled_since"])
    (stalled,) = events(session, "turn/stalled")
    assert stalled == {"since": since.isoformat(), "phase": "model"}
    assert fake_llm.keepalives_sent > 0

    staff = make_user("ops", is_staff=True)
    ops = call(client, "GET", "/api/ops/attention", **bearer(token_for(staff))).data
    assert [item["session_id"] for item in ops["attention"]["stalled"]] == [str(session.id)]
    client.force_login(staff)
    assert "terret_turns_stalled 1.0" in client.get("/metrics").content.decode()
    assert f'data-session="{session.id}"' in client.get("/ops/").content.decode()
    client.logout()

    time.sleep(STALL * 2)  # many sweep rounds later, the keep-alives still trickling
    assert kinds(session).count("turn/stalled") == 1
    assert detail(client, session, auth)["stalled_since"] == body["stalled_since"]

    resume.set()
    cleared = wait_for(
        lambda: (b := detail(client, session, auth))["stalled_since"] is None and b, timeout=30, what="the stall ends"
    )
    assert cleared["status"] == "running" and ended(session) is None  # cleared by streamed text, not by an event
    assert cleared["progress"]["streamed_tokens"] > 1
    wait_for(lambda: ended(session) == "completed", timeout=60, what="the turn completes")
    assert kinds(session).count("turn/stalled") == 1
    assert events(session, "assistant/message")[-1]["content"] == text


def test_on_stall_cancel_cancels_a_turn_whose_model_only_trickles_keep_alives(
    start_worker: Any, fake_llm: Any, owner: Any, profile: AgentProfile
) -> None:
    profile.on_stall = "cancel"
    profile.save()
    fake_llm.script(Reply(text="never sent", keepalive_forever=True, keepalive_after=1))
    session = services.create_session(owner, profile)
    start_worker(TERRET_STALL_SECONDS=STALL)
    services.run_turn(session.id, "hello")
    wait_for(lambda: ended(session) is not None, timeout=60, what="the turn ends")
    assert ended(session) == "cancelled"
    assert kinds(session).count("turn/stalled") == 1
    assert events(session, "turn/cancel_requested") == [
        {"by": "stall watch", "reason": "no progress (on_stall: cancel)"}
    ]
