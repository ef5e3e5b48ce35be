"""Session management: rename (the latest title wins), archive (hidden, its
agent disposed, its schedules cancelled), unarchive, search by title and
paging; the services and their pages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.urls import reverse

from sessions_app import log, services
from sessions_app.errors import InvalidInput
from sessions_app.models import Agent, AgentProfile, Event, Session
from sessions_app.services import sessions as session_services
from sessions_app.services import titling
from sessions_app.web.listing import LIST_PAGE_SIZE
from tests.helpers import client_for, kinds

pytestmark = pytest.mark.django_db


def test_rename_appends_a_titled_event_by_the_user_and_the_latest_wins(chat: Session) -> None:
    log.append(chat.id, "session/titled", {"title": "From the titler"})
    session_services.rename_session(chat.id, "  My   trip\n", by="owner")
    session_services.rename_session(chat.id, "Lisbon trip", by="owner")
    titled = list(
        Event.objects.filter(session=chat, kind="session/titled").order_by("seq").values_list("data", flat=True)
    )
    assert titled == [
        {"title": "From the titler"},
        {"title": "My trip", "by": "owner"},
        {"title": "Lisbon trip", "by": "owner"},
    ]
    chat.refresh_from_db()
    assert chat.title == "Lisbon trip"


def test_the_titler_does_not_overwrite_a_rename(chat: Session) -> None:
    session_services.rename_session(chat.id, "Named by me", by="owner")
    log.append(chat.id, "user/message", {"text": "what time is it"})
    assert titling.ensure_title(chat.id) is None  # titled already: the titler appends nothing
    chat.refresh_from_db()
    assert chat.title == "Named by me"


@pytest.mark.parametrize("title", ["", "   ", "x" * 81])
def test_a_bad_title_is_refused_and_nothing_appended(chat: Session, title: str) -> None:
    before = kinds(chat)
    with pytest.raises(InvalidInput):
        session_services.rename_session(chat.id, title, by="owner")
    assert kinds(chat) == before


def test_rename_page_htmx_and_plain(chat: Session, make_reviewer: Callable[..., Any]) -> None:
    url = reverse("sessions:rename", args=[chat.id])
    c = client_for(chat.owner)
    r = c.post(url, {"title": "Via htmx"}, headers={"HX-Request": "true"})
    assert r.status_code == 200 and "Renamed." in r.content.decode() and "<html" not in r.content.decode()
    r = c.post(url, {"title": "   "}, headers={"HX-Request": "true"})
    assert (
        r.status_code == 200
        and r["X-Terret-Error"] == "invalid_input"
        and "a title needs some text" in r.content.decode()
    )
    r = c.post(url, {"title": "Plain post"})
    assert r.status_code == 302
    chat.refresh_from_db()
    assert chat.title == "Plain post"
    # A reviewer may read but not rename.
    assert client_for(make_reviewer("rita")).post(url, {"title": "no"}).status_code == 403
    chat.refresh_from_db()
    assert chat.title == "Plain post"


def test_archive_hides_the_session_disposes_its_agent_and_unarchive_brings_it_back(chat: Session) -> None:
    c = client_for(chat.owner)
    log.append(chat.id, "session/titled", {"title": "Old plan"})
    assert Agent.objects.filter(session=chat).exists()
    r = c.post(reverse("sessions:archive", args=[chat.id]))
    assert r.status_code == 302 and r["Location"] == reverse("sessions:list")
    chat.refresh_from_db()
    assert chat.archived_at is not None
    assert not Agent.objects.filter(session=chat).exists()
    disposed = Event.objects.get(session=chat, kind="agent/disposed")
    assert disposed.data["by"] == "owner"
    assert f'id="row-{chat.id}"' not in c.get(reverse("sessions:list")).content.decode()
    assert f'id="row-{chat.id}"' in c.get(reverse("sessions:list") + "?archived=1").content.decode()
    page = c.get(reverse("sessions:chat", args=[chat.id])).content.decode()  # still readable
    assert "Unarchive" in page
    c.post(reverse("sessions:unarchive", args=[chat.id]))
    chat.refresh_from_db()
    assert chat.archived_at is None
    assert f'id="row-{chat.id}"' in c.get(reverse("sessions:list")).content.decode()


def test_archive_is_refused_while_a_turn_runs(chat: Session) -> None:
    services.inject(chat.id, "go", wake=True)
    with pytest.raises(InvalidInput, match="stop it"):
        session_services.archive_session(chat.id, by="owner")
    chat.refresh_from_db()
    assert chat.archived_at is None and Agent.objects.filter(session=chat).exists()
    r = client_for(chat.owner).post(reverse("sessions:archive", args=[chat.id]))
    assert r.status_code == 302 and r["Location"] == reverse("sessions:chat", args=[chat.id])


def test_archive_cancels_the_sessions_schedules(chat: Session) -> None:
    from sessions_app.models import Schedule
    from sessions_app.services import schedules

    made, _ = schedules.create(chat.id, {"text": "check the mail", "every_seconds": 3600}, by="owner")
    session_services.archive_session(chat.id, by="owner")
    made.refresh_from_db()
    assert made.status == "cancelled"
    assert not Schedule.objects.filter(session=chat).exclude(status="cancelled").exists()


def test_others_cannot_archive(chat: Session, make_user: Callable[..., Any], make_reviewer: Callable[..., Any]) -> None:
    assert client_for(make_user("mallory")).post(reverse("sessions:archive", args=[chat.id])).status_code == 404
    assert client_for(make_reviewer("rita")).post(reverse("sessions:archive", args=[chat.id])).status_code == 403
    chat.refresh_from_db()
    assert chat.archived_at is None


def test_search_by_title_and_paging(owner: Any, profile: AgentProfile) -> None:
    for i in range(LIST_PAGE_SIZE + 5):
        s = services.create_session(owner, profile)
        log.append(s.id, "session/titled", {"title": f"{'Lisbon' if i % 2 else 'Porto'} trip {i}"})
    c = client_for(owner)
    page = c.get(reverse("sessions:list") + "?q=lisbon").content.decode()
    assert page.count("Lisbon trip") == (LIST_PAGE_SIZE + 5) // 2 and "Porto" not in page
    assert "Page 1 of 2" in c.get(reverse("sessions:list")).content.decode()
    second = c.get(reverse("sessions:list") + "?page=2").content.decode()
    assert second.count("trip ") == 5
    none = c.get(reverse("sessions:list") + "?q=Madrid").content.decode()
    assert "No session has “Madrid” in its title." in none


def test_the_list_socket_fragment_is_the_list_body(chat: Session) -> None:
    from sessions_app.web.dashboard import dashboard_fragment

    log.append(chat.id, "session/titled", {"title": "Shown live"})
    html = dashboard_fragment(chat.owner, "list-1")
    assert (
        html.startswith('\n<div id="session-list" hx-swap-oob="true">')
        or 'id="session-list" hx-swap-oob="true"' in html
    )
    assert "Shown live" in html
    page = client_for(chat.owner).get(reverse("sessions:list")).content.decode()
    assert 'ws-connect="/ws/dashboard/?page=list-1"' in page
