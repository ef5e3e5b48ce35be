"""Django admin: sessions are browsable and searchable, the log is read-only
and paged. Also the ensure_admin command that `make run` uses."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from sessions_app.log import append
from sessions_app.models import Event, Session

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client: Client, django_user_model: Any) -> Client:
    user = django_user_model.objects.create_superuser("root", "", "root-pass-123")
    client.force_login(user)
    return client


@pytest.fixture
def busy(make_session: Any, make_user: Any) -> Session:
    owner = make_user("alice")
    s = make_session(owner=owner)
    append(s.id, "session/titled", {"title": "Paris weather"})
    append(s.id, "turn/start", {})
    append(s.id, "user/message", {"text": "hello <b>there</b>"})
    s.refresh_from_db()
    return s


def _bulk(session: Session, n: int) -> None:
    """n events in one statement: test data for paging only."""
    pg = connection.vendor == "postgresql"
    sid: Any = session.id if pg else session.id.hex
    now: Any = datetime.now(UTC) if pg else datetime.now(UTC).isoformat()
    start = session.last_seq
    with connection.cursor() as cur:
        cur.executemany(
            "INSERT INTO sessions_app_event (session_id, seq, kind, data, created_at) VALUES (%s, %s, %s, %s, %s)",
            [
                (sid, start + i, "input/queued", json.dumps({"text": f"n{i}", "wake": False}), now)
                for i in range(1, n + 1)
            ],
        )
        cur.execute("UPDATE sessions_app_session SET last_seq = %s WHERE id = %s", [start + n, sid])


# --- sessions ------------------------------------------------------------------


def test_session_changelist_shows_title_status_seq_owner(staff: Client, busy: Session, make_session: Any) -> None:
    other = make_session()
    r = staff.get(reverse("admin:sessions_app_session_changelist"))
    assert r.status_code == 200
    body = r.content.decode()
    assert "Paris weather" in body
    assert "alice" in body
    assert str(other.id) in body
    rows = r.context["cl"].result_list
    mine = next(s for s in rows if s.id == busy.id)
    assert (mine.status, mine.last_seq) == ("running", 3)
    header = [str(h["text"]).lower() for h in r.context["result_headers"]]
    for column in ("title", "status", "owner", "last seq"):
        assert column in header


def test_session_search_and_filters(staff: Client, busy: Session, make_session: Any, make_user: Any) -> None:
    bob = make_user("bob")
    other = make_session(owner=bob)
    url = reverse("admin:sessions_app_session_changelist")

    def ids(query: str) -> set[Any]:
        r = staff.get(url + query)
        assert r.status_code == 200
        return {s.id for s in r.context["cl"].result_list}

    assert ids("?q=paris") == {busy.id}
    assert ids("?q=bob") == {other.id}  # by owner's username
    assert ids(f"?q={busy.id}") == {busy.id}
    assert ids(f"?owner__id__exact={bob.id}") == {other.id}
    filters = [spec.title for spec in staff.get(url).context["cl"].filter_specs]
    assert "owner" in filters


def test_session_change_page_is_read_only(staff: Client, busy: Session) -> None:
    url = reverse("admin:sessions_app_session_change", args=[busy.id])
    r = staff.get(url)
    assert r.status_code == 200
    body = r.content.decode()
    assert "Paris weather" in body
    # Every field is read-only: no input for title or the projections.
    assert 'name="title"' not in body and 'name="last_seq"' not in body
    assert reverse("admin:sessions_app_session_delete", args=[busy.id]) not in body
    # A crafted POST cannot rewrite the projection the log owns.
    staff.post(url, {"title": "hijacked", "last_seq": "99"})
    busy.refresh_from_db()
    assert (busy.title, busy.last_seq) == ("Paris weather", 3)


def test_session_add_and_delete_are_refused(staff: Client, busy: Session) -> None:
    assert staff.get(reverse("admin:sessions_app_session_add")).status_code == 403
    assert staff.post(reverse("admin:sessions_app_session_delete", args=[busy.id]), {"post": "yes"}).status_code == 403
    assert Session.objects.filter(id=busy.id).exists()


# --- events --------------------------------------------------------------------


def test_event_changelist_renders_without_add(staff: Client, busy: Session) -> None:
    url = reverse("admin:sessions_app_event_changelist")
    r = staff.get(url)
    assert r.status_code == 200
    body = r.content.decode()
    assert "user/message" in body and "session/titled" in body
    assert reverse("admin:sessions_app_event_add") not in body  # no "Add event" button
    assert 'value="delete_selected"' not in body  # no bulk delete action
    assert r.context["cl"].result_count == 3


def test_event_change_page_is_a_view_without_save(staff: Client, busy: Session) -> None:
    event = Event.objects.get(session=busy, seq=3)
    url = reverse("admin:sessions_app_event_change", args=[event.pk])
    r = staff.get(url)
    assert r.status_code == 200
    body = r.content.decode()
    assert "hello &lt;b&gt;there&lt;/b&gt;" in body  # payload shown, escaped
    assert 'name="_save"' not in body and 'name="_continue"' not in body
    assert 'name="data"' not in body and 'name="kind"' not in body
    assert reverse("admin:sessions_app_event_delete", args=[event.pk]) not in body


def test_event_edits_are_refused(staff: Client, busy: Session) -> None:
    event = Event.objects.get(session=busy, seq=3)
    change = reverse("admin:sessions_app_event_change", args=[event.pk])
    assert staff.post(change, {"kind": "turn/start", "data": "{}", "seq": "3"}).status_code == 403
    assert staff.get(reverse("admin:sessions_app_event_add")).status_code == 403
    assert staff.post(reverse("admin:sessions_app_event_add"), {"seq": "9"}).status_code == 403
    delete = reverse("admin:sessions_app_event_delete", args=[event.pk])
    assert staff.get(delete).status_code == 403
    assert staff.post(delete, {"post": "yes"}).status_code == 403
    # The bulk delete action is not offered, and posting it does nothing.
    staff.post(
        reverse("admin:sessions_app_event_changelist"),
        {"action": "delete_selected", "_selected_action": [event.pk], "post": "yes"},
    )
    fresh = Event.objects.get(pk=event.pk)
    assert (fresh.kind, fresh.data) == ("user/message", {"text": "hello <b>there</b>"})
    assert Event.objects.filter(session=busy).count() == 3


def test_event_changelist_pages_in_log_order(staff: Client, busy: Session) -> None:
    _bulk(busy, 247)  # 250 events in all
    url = reverse("admin:sessions_app_event_changelist")
    first = staff.get(url)
    assert first.status_code == 200
    cl = first.context["cl"]
    assert cl.list_per_page == 100 and cl.can_show_all is False
    assert [e.seq for e in cl.result_list] == list(range(1, 101))
    assert "?all=" not in first.content.decode()  # never one 100k-row page
    last = staff.get(url + "?p=3")
    assert [e.seq for e in last.context["cl"].result_list] == list(range(201, 251))
    # Filtering by kind uses the catalogue, not a scan of the log.
    only = staff.get(url + "?kind=user/message")
    assert [e.seq for e in only.context["cl"].result_list] == [3]
    assert [c["display"] for c in only.context["cl"].filter_specs[0].choices(only.context["cl"])][1:4] == [
        "user/message",
        "context/injected",
        "assistant/message",
    ]


def test_event_changelist_queries_are_bounded(staff: Client, busy: Session, make_session: Any) -> None:
    """One session's events are found by exact session id, and a page's SQL
    orders by the (session_id, seq) index instead of sorting through a join."""
    other = make_session()
    append(other.id, "turn/start", {})
    _bulk(busy, 300)
    url = reverse("admin:sessions_app_event_changelist")
    with CaptureQueriesContext(connection) as ctx:
        r = staff.get(url + f"?q={busy.id}&p=2")
    assert r.status_code == 200
    assert {e.session_id for e in r.context["cl"].result_list} == {busy.id}
    assert [e.seq for e in r.context["cl"].result_list][:2] == [101, 102]
    sqls = [q["sql"] for q in ctx.captured_queries]
    page = next(s for s in sqls if 'FROM "sessions_app_event"' in s and "LIMIT 100" in s)
    assert re.search(r'ORDER BY "sessions_app_event"."session_id" ASC, "sessions_app_event"."seq" ASC', page), page
    assert "DISTINCT" not in " ".join(sqls)  # the kind filter does not scan the log
    assert len(sqls) <= 8, sqls  # no per-row queries


# --- ensure_admin ----------------------------------------------------------------


def test_ensure_admin_generates_and_prints_password_once(django_user_model: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("TERRET_ADMIN_PASSWORD", raising=False)
    monkeypatch.setenv("TERRET_ADMIN_USER", "boss")
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    m = re.search(r"password: (\S+)", out.getvalue())
    assert m, out.getvalue()
    user = django_user_model.objects.get(username="boss")
    assert user.is_superuser and user.is_staff and user.check_password(m.group(1))

    again = StringIO()
    call_command("ensure_admin", stdout=again)
    assert "password" not in again.getvalue() and m.group(1) not in again.getvalue()
    assert "exists" in again.getvalue()
    user.refresh_from_db()
    assert user.check_password(m.group(1))  # not reset


def test_ensure_admin_takes_password_from_environment(django_user_model: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("TERRET_ADMIN_USER", raising=False)
    monkeypatch.setenv("TERRET_ADMIN_PASSWORD", "from-the-env-42")
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    assert "from-the-env-42" not in out.getvalue()  # never echoed
    user = django_user_model.objects.get(username="admin")
    assert user.is_superuser and user.check_password("from-the-env-42")


def test_ensure_admin_refuses_a_short_password(django_user_model: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("TERRET_ADMIN_PASSWORD", "short")
    with pytest.raises(CommandError, match="at least 8"):
        call_command("ensure_admin", stdout=StringIO())
    assert not django_user_model.objects.filter(username="admin").exists()


def test_admin_login_works_with_the_created_user(client: Client, monkeypatch: Any) -> None:
    monkeypatch.setenv("TERRET_ADMIN_PASSWORD", "a-long-password-1")
    monkeypatch.delenv("TERRET_ADMIN_USER", raising=False)
    call_command("ensure_admin", stdout=StringIO())
    r = client.post(
        reverse("admin:login"),
        {"username": "admin", "password": "a-long-password-1", "next": "/admin/"},
    )
    assert r.status_code == 302 and r["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200
