"""The operators' console page (/ops/) and its buttons, and the admin actions."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from sessions_app import log, services
from sessions_app.models import AgentProfile, Notification, OperatorAction, Session, Suspension
from sessions_app.services import operators
from tests.helpers import client_for, events

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def staff(make_user: Any) -> Any:
    return make_user("opsy", is_staff=True)


@pytest.fixture
def ops(staff: Any) -> Client:
    return client_for(staff)


def block(session: Session) -> None:
    services.run_turn(session.id, "go")
    log.append(session.id, "turn/blocked", {"reason": "x", "attempts": 5})


def test_staff_see_every_section_and_the_nav_link(ops: Client, chat: Session) -> None:
    block(chat)
    response = ops.get("/ops/")
    assert response.status_code == 200
    html = response.content.decode()
    for heading in (
        "Blocked",
        "Suspended",
        "Revoked",
        "Held input",
        "Parked approvals",
        "Expired leases",
        "Effects of unknown outcome",
        "Notifications not sent",
        "Recent operator actions",
    ):
        assert heading in html
    assert f'href="/sessions/{chat.id}/"' in html
    assert f"/ops/sessions/{chat.id}/abandon/" in html and f"/ops/sessions/{chat.id}/retry/" in html
    assert 'href="/ops/"' in html  # the nav link


def test_notifications_not_sent_are_listed(ops: Client, chat: Session, owner: Any) -> None:
    """Failed (attempts ran out) and unknown (the sender died mid-send) rows need an operator; the rest do not."""
    for seq, status in enumerate(("failed", "unknown", "sent", "pending", "dropped"), start=1):
        Notification.objects.create(
            session=chat,
            seq=seq,
            kind="tool/unknown",
            name=f"n_{status}",
            recipient=owner,
            channel="webhook",
            status=status,
            last_error=f"why {status}",
        )
    html = ops.get("/ops/").content.decode()
    assert "Notifications not sent" in html
    assert "n_failed to" in html and "why failed" in html and "n_unknown to" in html
    assert "n_sent" not in html and "n_pending" not in html and "n_dropped" not in html
    assert "/admin/sessions_app/notification/?status__exact=failed" in html
    listed = operators.attention()["notifications"]
    assert [(i.detail["status"], i.session_id) for i in listed] == [("failed", str(chat.id)), ("unknown", str(chat.id))]


def test_others_get_403_and_the_anonymous_the_login_page(client: Client, owner: Any, chat: Session) -> None:
    assert client.get("/ops/").status_code == 302
    assert client.get("/ops/")["Location"].startswith("/accounts/login/")
    plain = client_for(owner)
    assert plain.get("/ops/").status_code == 403
    assert 'href="/ops/"' not in plain.get("/").content.decode()
    block(chat)
    for url, data in [
        ("/ops/suspend/", {"scope": "global", "target": "", "reason": ""}),
        ("/ops/resume/", {"scope": "global", "target": "", "reason": ""}),
        (f"/ops/sessions/{chat.id}/abandon/", {"reason": ""}),
        (f"/ops/sessions/{chat.id}/revoke/", {"reason": ""}),
    ]:
        assert plain.post(url, data).status_code == 403
    assert OperatorAction.objects.count() == 0 and not Suspension.objects.exists()
    assert Session.objects.get(id=chat.id).status == "blocked"


def test_abandon_button(ops: Client, chat: Session) -> None:
    block(chat)
    response = ops.post(f"/ops/sessions/{chat.id}/abandon/", {"reason": "dead provider"}, follow=True)
    assert response.redirect_chain[-1][0] == "/ops/"
    assert "Abandoned the blocked turn" in response.content.decode()
    assert events(chat, "turn/end")[0]["status"] == "failed"
    assert "dead provider" in response.content.decode()  # in the recent actions
    again = ops.post(f"/ops/sessions/{chat.id}/abandon/", {"reason": ""}, follow=True)
    assert "Nothing done" in again.content.decode()


def test_retry_button(ops: Client, chat: Session) -> None:
    block(chat)
    response = ops.post(f"/ops/sessions/{chat.id}/retry/", {"reason": ""}, follow=True)
    assert "Retrying the turn" in response.content.decode()
    assert events(chat, "turn/retry_requested")
    assert OperatorAction.objects.get().action == "retry"


def test_suspend_form_and_resume_button(ops: Client, chat: Session, profile: AgentProfile) -> None:
    response = ops.post("/ops/suspend/", {"scope": "profile", "target": profile.name, "reason": "r1"}, follow=True)
    html = response.content.decode()
    assert f"Suspended admission: profile {profile.name}." in html
    assert f"profile {profile.name}" in html and "Resume" in html
    assert Suspension.objects.filter(scope="profile", target=profile.name, by="opsy").exists()
    response = ops.post("/ops/resume/", {"scope": "profile", "target": profile.name, "reason": ""}, follow=True)
    assert "Resumed admission" in response.content.decode()
    assert not Suspension.objects.exists()
    bad = ops.post("/ops/suspend/", {"scope": "profile", "target": "nope"}, follow=True)
    assert "Nothing done" in bad.content.decode() and not Suspension.objects.exists()


def test_revoke_and_restore_buttons(ops: Client, chat: Session) -> None:
    ops.post(f"/ops/sessions/{chat.id}/revoke/", {"reason": "leak"})
    assert Session.objects.get(id=chat.id).revoked_seq is not None
    html = ops.get("/ops/").content.decode()
    assert f"/ops/sessions/{chat.id}/restore/" in html
    response = ops.post(f"/ops/sessions/{chat.id}/restore/", {"reason": ""}, follow=True)
    assert "Restored session" in response.content.decode()
    assert Session.objects.get(id=chat.id).revoked_seq is None
    assert ops.post(f"/ops/sessions/{chat.id}/explode/", {}).status_code == 404


def test_session_suspension_resume_button(ops: Client, chat: Session) -> None:
    ops.post("/ops/suspend/", {"scope": "session", "target": str(chat.id), "reason": ""})
    assert Session.objects.get(id=chat.id).suspended_seq is not None
    assert f'value="{chat.id}"' in ops.get("/ops/").content.decode()
    ops.post("/ops/resume/", {"scope": "session", "target": str(chat.id), "reason": ""})
    assert Session.objects.get(id=chat.id).suspended_seq is None


def test_admin_actions_call_the_services(make_user: Any, chat: Session, profile: AgentProfile) -> None:
    admin = client_for(make_user("root", is_staff=True, is_superuser=True))
    url = "/admin/sessions_app/session/"
    for action, check in [
        ("suspend_sessions", lambda s: s.suspended_seq is not None),
        ("resume_sessions", lambda s: s.suspended_seq is None),
        ("revoke_sessions", lambda s: s.revoked_seq is not None),
        ("restore_sessions", lambda s: s.revoked_seq is None),
    ]:
        response = admin.post(url, {"action": action, "_selected_action": [str(chat.id)]}, follow=True)
        assert response.status_code == 200
        assert str(chat.id) in response.content.decode()
        assert check(Session.objects.get(id=chat.id)), action
    purl = "/admin/sessions_app/agentprofile/"
    response = admin.post(purl, {"action": "suspend_profiles", "_selected_action": [profile.pk]}, follow=True)
    assert f"Suspended admission for: {profile.name}." in response.content.decode()
    assert Suspension.objects.filter(scope="profile", target=profile.name).exists()
    admin.post(purl, {"action": "resume_profiles", "_selected_action": [profile.pk]})
    assert not Suspension.objects.exists()
    assert set(OperatorAction.objects.values_list("actor", "reason")) == {("root", "via admin")}
    assert OperatorAction.objects.count() == 6
