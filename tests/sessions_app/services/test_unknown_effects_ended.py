"""Unknown effects of turns that ended (issue 31, point 6): an attempt a
cancelled turn left of unknown outcome stays on /ops/, in GET
/api/ops/attention and in /metrics until an operator resolves it, whatever
turns come after; and the sweep's effect audit of recently active sessions
keeps its findings for /ops/ and /metrics, a bounded batch a round."""

from __future__ import annotations

import time
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from sessions_app import log, services
from sessions_app.models import AgentProfile, EffectAudit, Session
from sessions_app.runtime import counters
from sessions_app.runtime.drive import drive
from sessions_app.runtime.sweep import sweep_round
from tests.fakes.fake_llm import Reply, responder_for_mode
from tests.helpers import events, wait_for
from tests.sessions_app.apiutil import bearer, call, token_for
from tests.sessions_app.runtime.test_effects import crash_after_intent
from tests.terret_site.test_metrics import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="effects-ended",
        roles={"main": "test/model"},
        builtin_tools=["debug.charge", "debug.noop"],
        allow_floor=["*"],
    )


@pytest.fixture
def staff(make_user: Any) -> Any:
    return make_user("opsy", is_staff=True)


@pytest.fixture
def staff_client(client: Client, staff: Any) -> Client:
    client.force_login(staff)
    return client


def attention(client: Client, staff: Any) -> dict[str, Any]:
    answer = call(client, "GET", "/api/ops/attention", **bearer(token_for(staff)))
    assert answer.status_code == 200, answer.data
    return answer.data


def listed(client: Client, staff: Any, session: Session) -> list[dict[str, Any]]:
    found = attention(client, staff)["attention"]["unknown_effects"]
    return [item for item in found if item["session_id"] == str(session.id)]


def unknown_gauges(client: Client) -> tuple[float, float]:
    samples = scrape(client)
    return value(samples, "terret_effects_unknown"), value(samples, "terret_effects_unknown_ended")


def wake_nobody(session_id: str) -> None:
    pass


@pytest.mark.usefixtures("manual_worker")
def test_a_cancelled_turns_unknown_effect_stays_listed_until_resolved(
    fake_llm: Any, session: Session, staff: Any, staff_client: Client
) -> None:
    crash = crash_after_intent(session, "debug.charge", {"seconds": 0})
    assert services.cancel(session.id, by="owner")
    assert events(session, "turn/end")[-1]["status"] == "cancelled"
    row = Session.objects.get(id=session.id)
    assert (row.open_turn_seq, row.unknown_effects, row.unresolved_effects) == (None, 0, 1)

    (item,) = listed(staff_client, staff, session)
    (unknown,) = events(session, "tool/unknown")
    assert item["detail"]["pending"] == 1 and item["detail"]["open_turn"] == 0
    assert [(c["call_id"], c["attempt"], c["tool"]) for c in item["detail"]["calls"]] == [
        (crash.call_id, 1, "debug.charge")
    ]
    assert attention(staff_client, staff)["counts"]["unknown_effects"] == 1
    assert unknown_gauges(staff_client) == (1.0, 1.0)
    page = staff_client.get("/ops/").content.decode()
    assert f'data-call="{crash.call_id}"' in page and "Mark done" in page

    # A later turn opens and ends: the old turn's effect is still the operators' question.
    fake_llm.script(Reply(text="hello again"))
    services.inject(session.id, "anything new?", wake=True)
    assert drive(session.id) == "ended"
    assert events(session, "turn/end")[-1] == {"status": "completed"}
    assert len(listed(staff_client, staff, session)) == 1
    assert unknown_gauges(staff_client) == (1.0, 1.0)

    # Resolved from /ops/: gone everywhere.
    answer = staff_client.post(
        f"/sessions/{session.id}/effects/resolve/", {"call_id": crash.call_id, "action": "failed", "reason": "refunded"}
    )
    assert answer.status_code == 302
    assert events(session, "tool/resolved")[-1]["action"] == "failed"
    assert listed(staff_client, staff, session) == []
    assert unknown_gauges(staff_client) == (0.0, 0.0)
    assert f'data-call="{crash.call_id}"' not in staff_client.get("/ops/").content.decode()
    assert unknown["attempt"] == 1


def corrupt(session: Session) -> None:
    """A ledger no runtime writes: an outcome naming an attempt never recorded."""
    services.run_turn(session.id, "go")
    log.append(
        session.id,
        "assistant/message",
        {"content": None, "tool_calls": [{"id": "c9", "name": "debug.noop", "arguments": "{}"}]},
    )
    log.append(session.id, "tool/result", {"call_id": "c9", "name": "debug.noop", "content": "ok", "attempt": 1})


@pytest.mark.usefixtures("manual_worker")
def test_the_sweep_audits_recently_active_sessions_and_keeps_what_it_found(
    owner: Any, profile: AgentProfile, staff: Any, staff_client: Client, settings: Any
) -> None:
    settings.TERRET_EFFECTS_AUDIT_BATCH = 2
    counters.forget()
    bad, good, quiet = (services.create_session(owner, profile) for _ in range(3))
    corrupt(bad)
    services.run_turn(good.id, "fine")
    services.run_turn(quiet.id, "long ago")
    Session.objects.filter(id=quiet.id).update(last_event_at=timezone.now() - timedelta(days=2))

    # A running turn's ledger is still moving: audited once its turn ends, not at every step.
    sweep_round(at_start=False, wake=wake_nobody)
    assert not EffectAudit.objects.exists()
    for s in (bad, good):
        log.append(s.id, "turn/end", {"status": "completed"})

    sweep_round(at_start=False, wake=wake_nobody)
    audits = {a.session_id: a for a in EffectAudit.objects.all()}
    assert set(audits) == {bad.id, good.id}, "recently active sessions only, at most the batch"
    assert audits[bad.id].found == 1 and "never recorded" in audits[bad.id].problems[0]
    assert audits[bad.id].audited_seq == Session.objects.get(id=bad.id).last_seq
    assert audits[good.id].found == 0 and audits[good.id].problems == []

    found = attention(staff_client, staff)["attention"]["effects_audit"]
    assert [(i["session_id"], i["detail"]["found"]) for i in found] == [(str(bad.id), 1)]
    assert "never recorded" in staff_client.get("/ops/").content.decode()
    samples = scrape(staff_client)
    assert value(samples, "terret_effects_audit_problems") == 1.0
    assert value(samples, "terret_effects_audit_sessions") == 1.0
    assert value(samples, "terret_effects_audits_total") == 2.0
    assert value(samples, "terret_effects_audit_findings_total") == 1.0

    # Nothing moved: the next round audits nothing again.
    sweep_round(at_start=False, wake=wake_nobody)
    assert value(scrape(staff_client), "terret_effects_audits_total") == 2.0
    # The good session moves on: audited again, and only it.
    log.append(good.id, "session/titled", {"title": "moved on"})
    sweep_round(at_start=False, wake=wake_nobody)
    assert value(scrape(staff_client), "terret_effects_audits_total") == 3.0
    assert EffectAudit.objects.get(session_id=good.id).audited_seq == Session.objects.get(id=good.id).last_seq


@pytest.mark.worker
def test_under_workers_a_killed_then_cancelled_turns_effect_stays_until_resolved(
    start_worker: Any, fake_llm: Any, session: Session, staff: Any, staff_client: Client, settings: Any, tmp_path: Any
) -> None:
    """A worker is killed inside debug.charge (a `never` tool), the next one
    parks the call for an operator, the owner cancels the turn: the effect
    stays listed and counted, the worker's sweep audits the ledger clean,
    and an operator's resolution over the API clears it."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    fake_llm.responder = responder_for_mode("tool-then-final", "debug.charge", {"seconds": 5})
    first = start_worker(name="a")
    services.inject(session.id, "charge it", wake=True)
    wait_for(lambda: bool(events(session, "tool/attempt")), timeout=30, what="the intent")
    time.sleep(0.3)
    first.kill()
    start_worker(name="b")
    wait_for(partial(lambda: Session.objects.get(id=session.id).status == "waiting_reconcile"), timeout=30, what="park")
    owner_auth = bearer(token_for(session.owner))
    assert call(staff_client, "POST", f"/api/sessions/{session.id}/cancel", {}, **owner_auth).status_code == 200
    wait_for(lambda: Session.objects.get(id=session.id).open_turn_seq is None, timeout=30, what="the turn's end")
    assert events(session, "turn/end")[-1]["status"] == "cancelled"

    (item,) = listed(staff_client, staff, session)
    assert item["detail"]["open_turn"] == 0 and item["detail"]["calls"][0]["tool"] == "debug.charge"
    assert unknown_gauges(staff_client) == (1.0, 1.0)
    wait_for(lambda: EffectAudit.objects.filter(session_id=session.id).exists(), timeout=30, what="the audit")
    assert EffectAudit.objects.get(session_id=session.id).problems == []
    call_id = item["detail"]["calls"][0]["call_id"]
    resolved = call(
        staff_client,
        "POST",
        f"/api/sessions/{session.id}/effects/{call_id}/resolve",
        {"action": "done", "result": "charged once"},
        **bearer(token_for(staff)),
    )
    assert resolved.status_code == 200, resolved.data
    assert listed(staff_client, staff, session) == []
    assert unknown_gauges(staff_client) == (0.0, 0.0)
