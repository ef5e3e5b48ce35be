"""Sessions a deploy stranded, in front of an operator: /ops/ and GET
/api/ops/attention list them (blocked definition_missing or
unsupported_version, or pinned to a version whose built-in tools the code
no longer has), with upgrade and abandon actions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from django.test import Client

from sessions_app import log, services
from sessions_app.log import catalogue
from sessions_app.models import AgentProfile, Session, WorkerProcess
from sessions_app.services import operators
from sessions_app.tools import builtins
from tests.helpers import client_for, edit_profile, events

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def ops(make_user: Any) -> Client:
    return client_for(make_user("opsy", is_staff=True))


def block(session: Session, code: str, what: str) -> None:
    services.run_turn(session.id, "go")
    log.append(session.id, "turn/blocked", {"reason": "gone", "attempts": 0, "code": code, "what": what})


def stranded() -> dict[str, dict[str, Any]]:
    return {i.session_id or "": i.detail for i in operators.attention()["stranded"]}


def test_blocked_by_a_deploy_is_stranded_and_other_blocks_are_not(
    chat: Session, owner: Any, profile: AgentProfile
) -> None:
    block(chat, "unsupported_version", "event:user/message@2")
    other = services.create_session(owner, profile)
    block(other, "definition_missing", "tool:gone.tool")
    retrying = services.create_session(owner, profile)
    services.run_turn(retrying.id, "go")
    log.append(retrying.id, "turn/blocked", {"reason": "x", "attempts": 5, "code": "retries_exhausted"})
    found = stranded()
    assert found[str(chat.id)] == {"code": "unsupported_version", "what": "event:user/message@2", "reason": "gone"}
    assert found[str(other.id)]["code"] == "definition_missing"
    assert str(retrying.id) not in found


def test_pinned_to_a_version_whose_tools_the_code_lost(
    chat: Session, profile: AgentProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    services.run_turn(chat.id, "go")  # its turn opens on version 1
    log.append(chat.id, "turn/end", {"status": "completed"})
    AgentProfile.objects.filter(id=profile.id).update(upgrade_policy="pinned")
    assert str(chat.id) not in stranded()
    monkeypatch.delitem(builtins.BUILTINS, "debug.sleep")  # a deploy removed it
    detail = stranded()[str(chat.id)]
    assert detail["code"] == "pinned_version" and detail["what"] == "tool:debug.sleep"
    assert detail["version"] == 1


def test_the_console_and_the_api_list_them_with_their_actions(ops: Client, chat: Session) -> None:
    block(chat, "unsupported_version", "event:user/message@2")
    html = ops.get("/ops/").content.decode()
    assert "Stranded by a deploy" in html
    assert "unsupported_version: event:user/message@2" in html
    for action in ("upgrade", "abandon", "retry"):
        assert f"/ops/sessions/{chat.id}/{action}/" in html
    listed = ops.get("/api/ops/attention").json()["attention"]["stranded"]
    assert [(i["kind"], i["session_id"], i["detail"]["code"]) for i in listed] == [
        ("stranded", str(chat.id), "unsupported_version")
    ]


def test_upgrade_button_moves_the_session_through_the_preflight(
    ops: Client, chat: Session, profile: AgentProfile
) -> None:
    block(chat, "definition_missing", "tool:gone.tool")
    edit_profile(profile, system_prompt="a new release's prompt")  # version 2
    response = ops.post(f"/ops/sessions/{chat.id}/upgrade/", {"reason": ""}, follow=True)
    assert "Upgraded to the newest version" in response.content.decode()
    assert events(chat, "session/upgraded")[0]["to"]["number"] == 2
    again = ops.post(f"/ops/sessions/{chat.id}/upgrade/", {"reason": ""}, follow=True)
    assert len(events(chat, "session/upgraded")) == 1  # on the newest already: nothing written
    assert again.status_code == 200


def test_abandon_button_closes_a_stranded_turn(ops: Client, chat: Session) -> None:
    block(chat, "unsupported_version", "event:user/message@2")
    ops.post(f"/ops/sessions/{chat.id}/abandon/", {"reason": "old data"}, follow=True)
    assert events(chat, "turn/end")[0]["status"] == "failed"
    assert str(chat.id) not in stranded()


def _follow_up_under_newer_code(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follow-up the next release's web tier queued (input/deferred at
    version 2) behind a turn that then ended: input waits, and no turn is open."""
    services.run_turn(session.id, "go")
    newer = replace(catalogue.CATALOGUE["input/deferred"], version=2)
    monkeypatch.setitem(catalogue.CATALOGUE, "input/deferred", newer)
    assert services.inject(session.id, "later", lane="follow_up").disposition == "queued"
    log.append(session.id, "turn/end", {"status": "completed"})
    monkeypatch.setitem(catalogue.CATALOGUE, "input/deferred", replace(newer, version=1))  # this process: the old code
    row = Session.objects.get(id=session.id)
    assert row.open_turn_seq is None and row.queued_follow_ups == 1 and row.event_versions == {"input/deferred": 2}


def _worker(key: int, versions: dict[str, int]) -> WorkerProcess:
    return WorkerProcess.objects.create(key=key, host="h", pid=key, build="b", event_versions=versions)


def test_waiting_input_no_live_worker_reads_is_stranded_until_one_does(
    ops: Client, chat: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    _follow_up_under_newer_code(chat, monkeypatch)
    old = _worker(1, catalogue.versions())
    detail = stranded()[str(chat.id)]
    assert detail["code"] == "unsupported_version" and detail["what"] == "event:input/deferred@2"
    assert detail["waiting"] == "input"
    listed = ops.get("/api/ops/attention").json()["attention"]["stranded"]
    assert [(i["session_id"], i["detail"]["what"]) for i in listed] == [(str(chat.id), "event:input/deferred@2")]
    html = ops.get("/ops/").content.decode()
    assert "unsupported_version: event:input/deferred@2" in html
    assert "it runs once a worker that reads this log registers" in html
    assert f"/ops/sessions/{chat.id}/retry/" not in html  # no turn is open to retry or abandon

    _worker(2, {**catalogue.versions(), "input/deferred": 2})  # a worker of the next release registers
    assert str(chat.id) not in stranded()
    WorkerProcess.objects.exclude(pk=old.pk).delete()
    assert str(chat.id) in stranded()


def test_with_no_worker_registered_this_code_is_the_reader(chat: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded worker registers no row: it runs this process's code."""
    _follow_up_under_newer_code(chat, monkeypatch)
    assert stranded()[str(chat.id)]["what"] == "event:input/deferred@2"
    monkeypatch.setitem(
        catalogue.CATALOGUE, "input/deferred", replace(catalogue.CATALOGUE["input/deferred"], version=2)
    )
    assert str(chat.id) not in stranded()
