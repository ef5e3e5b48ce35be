"""The dashboard, the compact endpoint (with and without htmx), the admin
action, the management command and the dashboard's live socket."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from sessions_app import log, services
from sessions_app.log import hints
from sessions_app.models import AgentProfile, Event, Session, UsageDay
from sessions_app.services import budgets
from sessions_app.web.dashboard_socket import DashboardConsumer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def profile() -> AgentProfile:
    return AgentProfile.objects.create(name="dash", roles={"main": "demo/offline", "compactor": "demo/offline"})


def _usage(prompt: int, completion: int, cost: float | None) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "cost": cost}


def _closed_turn(session: Session, text: str, usage: dict[str, Any] | None) -> None:
    log.append(session.id, "turn/start", {})
    log.append(session.id, "user/message", {"text": text})
    log.append(session.id, "step/start", {"step": 1, "model": "demo/offline"})
    log.append(session.id, "assistant/message", {"content": "ok"})
    log.append(session.id, "step/end", {"step": 1, "usage": usage} if usage else {"step": 1})
    log.append(session.id, "turn/end", {"status": "completed"})


@pytest.fixture
def owner(make_user: Any) -> Any:
    return make_user("alice")


@pytest.fixture
def priced(owner: Any, profile: AgentProfile) -> Session:
    s = services.create_session(owner, profile)
    _closed_turn(s, "priced work", _usage(1200, 34, 0.0123))
    log.append(s.id, "session/titled", {"title": "Priced session"})
    return s


@pytest.fixture
def unpriced(owner: Any, profile: AgentProfile) -> Session:
    s = services.create_session(owner, profile)
    _closed_turn(s, "unpriced work", _usage(500, 5, None))
    log.append(s.id, "session/titled", {"title": "Unpriced session"})
    return s


# ---------------------------------------------------------------- page


def test_dashboard_needs_login(client: Any) -> None:
    response = client.get("/dashboard/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_owner_sees_own_sessions_with_figures(
    client: Any, owner: Any, make_user: Any, priced: Session, unpriced: Session, profile: AgentProfile
) -> None:
    other = services.create_session(make_user("bob"), profile)
    log.append(other.id, "session/titled", {"title": "Bob secret"})
    client.force_login(owner)
    html = client.get("/dashboard/").content.decode()
    assert "Priced session" in html and "Unpriced session" in html
    assert "Bob secret" not in html
    assert "$0.0123" in html and "1234" in html  # cost and tokens (1200 + 34)
    assert "dash-" in html  # the agent id (profile name prefix)
    # the unpriced session counts its unpriced call beside the priced part
    row = html[html.index("Unpriced session") :]
    row = row[: row.index("</tr>")]
    assert "$0.0000 + 1 unpriced" in row
    # per-profile totals over the user's own sessions; no global per-day chart for a plain user
    assert "<svg" not in html and "shown to staff and reviewers" in html
    assert "$0.0123 + 1 unpriced" in html


def test_staff_sees_totals_per_profile_and_day_and_the_chart(
    client: Any, make_user: Any, priced: Session, unpriced: Session, profile: AgentProfile
) -> None:
    staff = make_user("root", is_staff=True)
    client.force_login(staff)
    html = client.get("/dashboard/").content.decode()
    assert '<svg class="cost-chart"' in html and "<rect" in html
    assert 'class="unpriced"' in html  # today's marker: an unpriced step
    # One row per tally shard the two sessions fall on: the page shows their sum.
    (day,) = (
        UsageDay.objects.filter(profile=profile)
        .values("day")
        .annotate(steps=Sum("steps"), unpriced=Sum("unpriced_entries"), cost=Sum("cost"))
    )
    assert (day["steps"], day["unpriced"], day["cost"]) == (2, 1, Decimal("0.0123"))
    assert day["day"].isoformat() in html
    assert "$0.0123 + 1 unpriced" in html
    assert "alice" in html  # the owner column


def test_page_views_never_read_the_log(client: Any, owner: Any, priced: Session, make_user: Any) -> None:
    staff = make_user("root", is_staff=True)
    for user in (owner, staff):
        client.force_login(user)
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/dashboard/").status_code == 200
        assert not [q["sql"] for q in queries if "sessions_app_event" in q["sql"]]
        assert len(queries) < 20


def test_htmx_gets_the_body_partial(client: Any, owner: Any, priced: Session) -> None:
    client.force_login(owner)
    response = client.get("/dashboard/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="dashboard-body"') and "<html" not in html
    assert "Priced session" in html


# ---------------------------------------------------------------- budgets


def _row(html: str, title: str) -> str:
    start = html.rindex("<tr", 0, html.index(title))
    return html[start : html.index("</tr>", start)]


def test_a_session_budget_shows_spent_against_limit(client: Any, owner: Any, priced: Session) -> None:
    budgets.set_budget(priced.id, {"cost_usd": 1.5, "turns": 10})
    client.force_login(owner)
    row = _row(client.get("/dashboard/").content.decode(), "Priced session")
    assert "budget: cost $0.0123 / $1.50 · turns 1 / 10" in row
    assert "tokens" not in row.split("budget:")[1] and "steps" not in row  # only the limits that are set
    assert "exhausted" not in row


def test_an_exhausted_session_budget_is_marked(
    client: Any, owner: Any, priced: Session, unpriced: Session, make_user: Any
) -> None:
    budgets.set_budget(priced.id, {"turns": 1, "tokens": 100000})
    budgets.set_budget(unpriced.id, {"cost_usd": 1})
    client.force_login(owner)
    html = client.get("/dashboard/").content.decode()
    row = _row(html, "Priced session")
    assert 'class="budget-exhausted"' in row and "(exhausted)" in row
    assert "tokens 1234 / 100000 · turns 1 / 1" in row
    # an unpriced spend under a cost budget cannot be enforced: exhausted, its unpriced call counted
    row = _row(html, "Unpriced session")
    assert "cost $0.0000 + 1 unpriced / $1.00" in row and "(exhausted)" in row


def test_a_profile_daily_limit_shows_todays_spend(
    client: Any, owner: Any, priced: Session, unpriced: Session, profile: AgentProfile, settings: Any
) -> None:
    profile.daily_tokens = 5000
    profile.daily_cost_usd = Decimal("0.05")
    profile.save()
    settings.TERRET_DAILY_TURNS = 2
    client.force_login(owner)
    html = client.get("/dashboard/").content.decode()
    assert "Today&#x27;s budgets (UTC)" in html or "Today's budgets (UTC)" in html
    row = _row(html, 'data-scope="profile"')
    assert ">dash<" in row or "dash " in row
    # today's figures from UsageDay; the unpriced entry makes the cost budget unenforceable
    assert "cost $0.0123 + 1 unpriced / $0.05" in row and "tokens 1739 / 5000" in row
    assert "budget-exhausted" in row
    assert 'data-scope="global"' not in html  # global limits are for staff and reviewers


def test_global_daily_limits_are_shown_to_staff_only(
    client: Any, owner: Any, make_user: Any, priced: Session, settings: Any
) -> None:
    settings.TERRET_DAILY_TURNS = 5
    settings.TERRET_DAILY_COST_USD = Decimal("0.0100")
    client.force_login(owner)
    assert 'data-scope="global"' not in client.get("/dashboard/").content.decode()
    client.force_login(make_user("root", is_staff=True))
    html = client.get("/dashboard/").content.decode()
    row = _row(html, 'data-scope="global"')
    assert "All sessions" in row and "turns 1 / 5" in row
    assert "budget-exhausted" in row and '"budget-line exhausted">cost $0.0123 / $0.01<' in row  # $0.0123 >= $0.01


def test_budgets_add_no_query_per_row(
    client: Any, owner: Any, make_user: Any, profile: AgentProfile, settings: Any
) -> None:
    profile.daily_steps = 100
    profile.save()
    settings.TERRET_DAILY_TOKENS = 10**6
    staff = make_user("root", is_staff=True)

    def budgeted_session(n: int) -> None:
        s = services.create_session(owner, profile)
        _closed_turn(s, f"work {n}", _usage(10, 1, 0.001))
        budgets.set_budget(s.id, {"cost_usd": 1, "tokens": 1000, "steps": 10, "turns": 10})

    def count(user: Any) -> int:
        client.force_login(user)
        with CaptureQueriesContext(connection) as queries:
            html = client.get("/dashboard/").content.decode()
        assert "budget: cost $0.0010 / $1.00" in html
        return len(queries)

    budgeted_session(0)
    before = {u.pk: count(u) for u in (owner, staff)}
    for n in range(1, 6):
        budgeted_session(n)
    assert {u.pk: count(u) for u in (owner, staff)} == before


# ---------------------------------------------------------------- compact endpoint


def _compact_url(session: Session) -> str:
    return reverse("dashboard:compact", args=[session.id])


def test_compact_url() -> None:
    sid = "0b4c2f3e-0000-4000-8000-000000000000"
    assert reverse("dashboard:compact", args=[sid]) == f"/sessions/{sid}/compact/"


def test_compact_without_htmx_redirects_back_with_a_message(client: Any, owner: Any, priced: Session) -> None:
    client.force_login(owner)
    response = client.post(_compact_url(priced), follow=False)
    assert response.status_code == 302
    assert response["Location"] == reverse("sessions:chat", args=[priced.id])
    assert Event.objects.filter(session=priced, kind="session/compacted").count() == 1
    page = client.get("/dashboard/")
    assert "Compacted: events up to #" in page.content.decode()


def test_compact_with_htmx_returns_a_fragment(client: Any, owner: Any, priced: Session) -> None:
    client.force_login(owner)
    response = client.post(_compact_url(priced), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert 'class="compact-result ok"' in response.content.decode()
    again = client.post(_compact_url(priced), HTTP_HX_REQUEST="true").content.decode()
    assert "compact-result error" in again and "nothing new to compact" in again


def test_compact_declines_during_a_turn(client: Any, owner: Any, priced: Session) -> None:
    services.run_turn(priced.id, "a live turn")
    client.force_login(owner)
    html = client.post(_compact_url(priced), HTTP_HX_REQUEST="true").content.decode()
    assert "declined" in html and "a turn is open" in html
    assert not Event.objects.filter(session=priced, kind="session/compacted").exists()


def test_compact_reports_an_unconfigured_compactor(client: Any, owner: Any, priced: Session) -> None:
    AgentProfile.objects.filter(id=priced.profile_id).update(roles={"main": "demo/offline"})
    client.force_login(owner)
    html = client.post(_compact_url(priced), HTTP_HX_REQUEST="true").content.decode()
    assert "Compaction failed" in html and "compactor" in html


def test_compact_permissions(client: Any, make_user: Any, priced: Session) -> None:
    assert client.post(_compact_url(priced)).status_code == 302  # to the login page
    client.force_login(make_user("mallory"))
    assert client.post(_compact_url(priced)).status_code == 404  # not even visible
    reviewer = make_user("rita")
    reviewer.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    client.force_login(reviewer)
    assert client.post(_compact_url(priced)).status_code == 403  # may view, may not drive
    client.force_login(priced.owner)
    assert client.get(_compact_url(priced)).status_code == 405
    assert not Event.objects.filter(session=priced, kind="session/compacted").exists()


# ---------------------------------------------------------------- admin, command


def test_admin_actions(client: Any, make_user: Any, priced: Session) -> None:
    admin = make_user("boss", is_staff=True, is_superuser=True)
    client.force_login(admin)
    url = reverse("admin:sessions_app_session_changelist")
    response = client.post(url, {"action": "compact_selected", "_selected_action": [str(priced.id)]}, follow=True)
    assert "Compacted: events up to #" in response.content.decode()
    assert Event.objects.filter(session=priced, kind="session/compacted").count() == 1
    response = client.post(url, {"action": "check_usage", "_selected_action": [str(priced.id)]}, follow=True)
    assert "totals match the log" in response.content.decode()


def test_management_command(priced: Session, capsys: Any) -> None:
    call_command("compact_session", str(priced.id))
    assert f"{priced.id}: compacted up to #" in capsys.readouterr().out
    call_command("compact_session", str(priced.id))
    assert "declined: nothing new to compact" in capsys.readouterr().out
    call_command("compact_session", str(priced.id), "--check-usage")
    assert "usage totals match the log" in capsys.readouterr().out
    with pytest.raises(CommandError):
        call_command("compact_session", "00000000-0000-4000-8000-000000000000")
    AgentProfile.objects.filter(id=priced.profile_id).update(roles={})
    log.append(priced.id, "user/message", {"text": "more"})
    with pytest.raises(CommandError):
        call_command("compact_session", str(priced.id))
    assert "compactor" in capsys.readouterr().err


# ---------------------------------------------------------------- live socket


async def _connect(user: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def test_socket_sends_the_body_again_only_for_visible_sessions(
    owner: Any, make_user: Any, priced: Session, profile: AgentProfile
) -> None:
    other = await sync_to_async(services.create_session)(await sync_to_async(make_user)("carol"), profile)
    communicator = await _connect(owner)
    layer = get_channel_layer()
    # someone else's session: nothing is sent
    await layer.group_send(hints.DASHBOARD_GROUP, {"type": "log.hint", "session": str(other.id), "seq": 3})
    assert await communicator.receive_nothing(timeout=1.0)
    # a burst on the user's own session: the body, rendered again, as one out-of-band swap
    for seq in (7, 8, 9):
        await layer.group_send(hints.DASHBOARD_GROUP, {"type": "log.hint", "session": str(priced.id), "seq": seq})
    message = (await communicator.receive_from(timeout=3)).strip()
    assert message.startswith('<div id="dashboard-body" hx-swap-oob="true">')
    assert reverse("sessions:chat", args=[priced.id]) in message and "<html" not in message
    assert await communicator.receive_nothing(timeout=1.0)
    # the user is deactivated: the next hint closes the socket instead
    owner.is_active = False
    await sync_to_async(owner.save)()
    await layer.group_send(hints.DASHBOARD_GROUP, {"type": "log.hint", "session": str(priced.id), "seq": 10})
    closing = await communicator.receive_output(timeout=3)
    while closing["type"] != "websocket.close":
        closing = await communicator.receive_output(timeout=3)
    assert closing["code"] == 4403
    await communicator.disconnect()


async def test_socket_refuses_anonymous() -> None:
    from django.contrib.auth.models import AnonymousUser

    communicator = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
    communicator.scope["user"] = AnonymousUser()
    await communicator.connect()
    out = await communicator.receive_output(timeout=3)
    while out["type"] != "websocket.close":
        out = await communicator.receive_output(timeout=3)
    assert out["code"] == 4401
    await asyncio.sleep(0)


@pytest.fixture(autouse=True)
def no_compactor_from_the_environment(settings: Any) -> None:
    settings.TERRET_MODEL_COMPACTOR = ""
