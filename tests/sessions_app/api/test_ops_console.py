"""The operators' JSON API: attention, suspend, resume, abandon, revoke,
restore. Staff only (401 anonymous, 403 not_allowed for anyone else); a
refused or invalid request appends nothing and records nothing; each action
is one OperatorAction with its actor and reason."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.models import Event, OperatorAction, Session, Suspension
from tests.helpers import events
from tests.sessions_app.apiutil import bearer, call, event_count, token_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def staff(make_user: Any) -> Any:
    return make_user("opsy", is_staff=True)


@pytest.fixture
def staff_auth(staff: Any) -> dict[str, str]:
    return bearer(token_for(staff))


def block(session: Session) -> None:
    services.run_turn(session.id, "go")
    log.append(session.id, "turn/blocked", {"reason": "x", "attempts": 5})


def endpoints(session: Session) -> list[tuple[str, str, Any]]:
    sid = session.id
    return [
        ("GET", "/api/ops/attention", None),
        ("POST", "/api/ops/suspend", {"scope": "global", "target": "", "reason": "r"}),
        ("POST", "/api/ops/resume", {"scope": "global", "target": "", "reason": "r"}),
        ("POST", f"/api/sessions/{sid}/abandon", {"reason": "r"}),
        ("POST", f"/api/sessions/{sid}/revoke", {"reason": "r"}),
        ("POST", f"/api/sessions/{sid}/restore", {"reason": "r"}),
    ]


@pytest.mark.parametrize("index", range(6))
def test_permission_matrix(index: int, client: Any, session: Session, auth: Any, staff_auth: Any) -> None:
    block(session)
    method, url, body = endpoints(session)[index]
    before = event_count()
    anonymous = call(client, method, url, body)
    assert anonymous.status_code == 401 and anonymous.data["code"] == "unauthenticated"
    owner = call(client, method, url, body, **auth)
    assert owner.status_code == 403 and owner.data["code"] == "not_allowed"
    assert event_count() == before and OperatorAction.objects.count() == 0
    ok = call(client, method, url, body, **staff_auth)
    assert ok.status_code == 200, ok.data
    if method == "POST":
        assert ok.data["ok"] is True
        assert OperatorAction.objects.count() == 1


def test_a_signed_in_staff_member_needs_the_csrf_token(session: Session, staff: Any) -> None:
    from django.test import Client

    c = Client(enforce_csrf_checks=True)
    c.force_login(staff)
    response = call(c, "POST", "/api/ops/suspend", {"scope": "global", "target": "", "reason": ""})
    assert response.status_code == 403 and response.data["code"] == "csrf_failed"
    assert call(c, "GET", "/api/ops/attention").status_code == 200
    assert not Suspension.objects.exists()


@pytest.mark.parametrize(
    ("url", "body", "status"),
    [
        ("/api/ops/suspend", {"scope": "planet", "target": "", "reason": ""}, 400),
        ("/api/ops/suspend", {"scope": "profile", "target": "nope", "reason": ""}, 400),
        ("/api/ops/suspend", {"scope": "profile", "target": "", "reason": ""}, 400),
        ("/api/ops/suspend", {"scope": "session", "target": "not-a-uuid", "reason": ""}, 400),
        ("/api/ops/suspend", {"scope": "session", "target": "00000000-0000-0000-0000-000000000000"}, 404),
        ("/api/ops/suspend", {"scope": "global", "reason": "x" * 501}, 400),
        ("/api/ops/suspend", {"scope": "global", "extra": 1}, 400),
        ("/api/ops/resume", {"scope": "global", "reason": 5}, 400),
        ("{sid}/abandon", {"reason": "x" * 501}, 400),
        ("{sid}/revoke", {"reason": "a\x00b"}, 400),
        ("{sid}/restore", {"why": "x"}, 400),
        ("/api/sessions/nope/revoke", {"reason": ""}, 404),
        ("/api/sessions/00000000-0000-0000-0000-000000000000/abandon", {"reason": ""}, 404),
    ],
)
def test_invalid_requests_append_and_record_nothing(
    client: Any, session: Session, staff_auth: Any, url: str, body: Any, status: int
) -> None:
    url = url.replace("{sid}", f"/api/sessions/{session.id}")
    before = event_count()
    response = call(client, "POST", url, body, **staff_auth)
    assert response.status_code == status, response.data
    assert response.data["code"] in {"invalid_input", "unknown_session"}
    assert event_count() == before
    assert OperatorAction.objects.count() == 0 and not Suspension.objects.exists()


def test_suspend_lists_it_and_resume_removes_it(client: Any, session: Session, staff_auth: Any) -> None:
    name = session.profile.name  # type: ignore[union-attr]
    body = {"scope": "profile", "target": name, "reason": "incident 7"}
    assert call(client, "POST", "/api/ops/suspend", body, **staff_auth).data == {"ok": True, "woken": None}
    found = call(client, "GET", "/api/ops/attention", **staff_auth).data
    assert found["counts"]["suspended"] == 1
    (item,) = found["attention"]["suspended"]
    assert item["session_id"] is None and item["detail"] == {
        "scope": "profile",
        "target": name,
        "by": "opsy",
        "reason": "incident 7",
    }
    assert set(found["counts"]) == {
        "blocked",
        "suspended",
        "revoked",
        "held_input",
        "approvals",
        "expired_leases",
        "unknown_effects",
        "effects_audit",
        "stalled",
        "notifications",
        "stranded",
        "monitors",
        "tasks_live",
        "tasks_blocked",
        "tasks_orphaned",
    }
    resumed = call(client, "POST", "/api/ops/resume", {**body, "reason": "fixed"}, **staff_auth)
    assert resumed.status_code == 200 and resumed.data["ok"] is True
    after = call(client, "GET", "/api/ops/attention", **staff_auth).data
    assert after["attention"]["suspended"] == []
    actions = list(OperatorAction.objects.order_by("at").values_list("actor", "action", "scope", "target", "reason"))
    assert actions == [("opsy", "suspend", "profile", name, "incident 7"), ("opsy", "resume", "profile", name, "fixed")]


def test_a_session_suspension_is_listed_with_the_session(client: Any, session: Session, staff_auth: Any) -> None:
    body = {"scope": "session", "target": str(session.id), "reason": "look"}
    assert call(client, "POST", "/api/ops/suspend", body, **staff_auth).status_code == 200
    found = call(client, "GET", "/api/ops/attention", **staff_auth).data["attention"]["suspended"]
    assert [i["session_id"] for i in found] == [str(session.id)]
    assert call(client, "POST", "/api/ops/resume", body, **staff_auth).data["woken"] == 1
    assert call(client, "GET", "/api/ops/attention", **staff_auth).data["counts"]["suspended"] == 0


def test_abandon_closes_a_blocked_turn_failed_with_the_actor(client: Any, session: Session, staff_auth: Any) -> None:
    block(session)
    found = call(client, "GET", "/api/ops/attention", **staff_auth).data
    assert [i["session_id"] for i in found["attention"]["blocked"]] == [str(session.id)]
    assert found["attention"]["blocked"][0]["age_seconds"] is not None
    response = call(client, "POST", f"/api/sessions/{session.id}/abandon", {"reason": "gave up"}, **staff_auth)
    assert response.status_code == 200 and response.data == {"ok": True, "status": "idle"}
    assert events(session, "turn/end") == [{"status": "failed", "error": "abandoned by opsy: gave up", "by": "opsy"}]
    assert call(client, "GET", "/api/ops/attention", **staff_auth).data["counts"]["blocked"] == 0
    assert list(OperatorAction.objects.values_list("actor", "action", "target", "reason")) == [
        ("opsy", "abandon", str(session.id), "gave up")
    ]
    before = event_count()
    again = call(client, "POST", f"/api/sessions/{session.id}/abandon", {"reason": ""}, **staff_auth)
    assert again.status_code == 409 and again.data["code"] == "not_abandonable"
    assert event_count() == before and OperatorAction.objects.count() == 1


def test_revoke_then_restore(client: Any, session: Session, staff_auth: Any, auth: Any) -> None:
    response = call(client, "POST", f"/api/sessions/{session.id}/revoke", {"reason": "leaked"}, **staff_auth)
    assert response.status_code == 200 and response.data["ok"] is True
    assert Session.objects.get(id=session.id).revoked_seq is not None
    assert events(session, "session/revoked") == [{"by": "opsy", "reason": "leaked"}]
    found = call(client, "GET", "/api/ops/attention", **staff_auth).data["attention"]["revoked"]
    assert [i["session_id"] for i in found] == [str(session.id)]
    refused = call(client, "POST", f"/api/sessions/{session.id}/inputs", {"text": "hi"}, **auth)
    assert refused.status_code == 409 and refused.data["code"] == "session_revoked"
    restored = call(client, "POST", f"/api/sessions/{session.id}/restore", {"reason": "rotated"}, **staff_auth)
    assert restored.status_code == 200 and restored.data["ok"] is True
    assert Session.objects.get(id=session.id).revoked_seq is None
    assert events(session, "session/restored") == [{"by": "opsy", "reason": "rotated"}]
    assert list(OperatorAction.objects.order_by("at").values_list("actor", "action", "reason")) == [
        ("opsy", "revoke", "leaked"),
        ("opsy", "restore", "rotated"),
    ]
    assert Event.objects.filter(session=session, kind="session/revoked").count() == 1
