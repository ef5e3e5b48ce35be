"""Wakes racing on an idle agent from several OS processes: exactly one
turn/start, and no text is dropped. Each child calls services.inject(wake=
True) at a file barrier; the common admission is one guarded statement and
its losers fall back to the locked path, which queues their text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from sessions_app import services
from sessions_app.models import AgentProfile, Event
from sessions_app.runtime.drive import drive
from tests.fakes.fake_llm import Reply
from tests.sessions_app.log.test_concurrency import _child_env, _test_database_url, run_at_barrier

WAKERS = 6

CHILD = r"""
import json, os, sys, time
import django
django.setup()
from django.db import connection
from sessions_app import services

sid, me, go = sys.argv[1], sys.argv[2], sys.argv[3]
connection.ensure_connection()
print("ready", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("barrier never opened")
    time.sleep(0.001)
r = services.inject(sid, f"from {me}", wake=True)
connection.close()
print(json.dumps({"text": f"from {me}", "disposition": r.disposition, "seq": r.seq}), flush=True)
"""


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_wakes_open_one_turn_and_lose_no_text(
    make_user: Any, tmp_path: Path, fake_llm: Any, settings: Any
) -> None:
    settings.TERRET_WORKER = "manual"
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    profile = AgentProfile.objects.create(name="race", roles={"main": "test/main"})
    session = services.create_session(make_user(), profile)
    assert connection.settings_dict["NAME"].startswith("test_")
    env = _child_env(_test_database_url())
    env["TERRET_WORKER"] = "manual"
    receipts = run_at_barrier(CHILD, [[str(session.id), str(i)] for i in range(WAKERS)], env, tmp_path)

    assert sorted(r["disposition"] for r in receipts) == ["queued"] * (WAKERS - 1) + ["started"]
    rows = list(Event.objects.filter(session=session).order_by("seq").values_list("kind", "data"))
    assert [k for k, _ in rows].count("turn/start") == 1
    winner = next(r["text"] for r in receipts if r["disposition"] == "started")
    assert ("user/message", {"text": winner}) in rows
    queued = sorted(d["text"] for k, d in rows if k == "input/queued")
    assert queued == sorted(r["text"] for r in receipts if r["disposition"] == "queued")

    # The losers' text rides the winner's first step.
    fake_llm.script(Reply(text="heard you all"))
    assert drive(session.id) == "ended"
    injected = sorted(
        d["text"] for d in Event.objects.filter(session=session, kind="context/injected").values_list("data", flat=True)
    )
    assert injected == queued
    sent = [m.get("content") for m in fake_llm.requests[0]["messages"]]
    assert all(text in sent for text in [winner, *queued])
