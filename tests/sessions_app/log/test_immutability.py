"""Events are append-only: the ORM refuses changes everywhere, Postgres
refuses them at the table (trigger) even for raw SQL."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from sessions_app.errors import ImmutableEventError
from sessions_app.log import append
from sessions_app.models import Event, Session

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(make_session: Any) -> Event:
    s = make_session()
    append(s.id, "user/message", {"text": "original"})
    return Event.objects.get(session=s, seq=1)


def _unchanged(event: Event) -> None:
    fresh = Event.objects.get(pk=event.pk)
    assert (fresh.seq, fresh.kind, fresh.data) == (1, "user/message", {"text": "original"})


def test_instance_save_is_refused(event: Event) -> None:
    event.data = {"text": "rewritten"}
    with pytest.raises(ImmutableEventError):
        event.save()
    with pytest.raises(ImmutableEventError):
        event.save(update_fields=["data"])
    _unchanged(event)


def test_creating_an_event_outside_append_is_refused(make_session: Any) -> None:
    s = make_session()
    with pytest.raises(ImmutableEventError):
        Event(session=s, seq=1, kind="user/message", data={"text": "x"}).save()
    with pytest.raises(ImmutableEventError):
        Event.objects.create(session=s, seq=1, kind="user/message", data={"text": "x"})
    assert not Event.objects.filter(session=s).exists()


def test_instance_delete_is_refused(event: Event) -> None:
    with pytest.raises(ImmutableEventError):
        event.delete()
    _unchanged(event)


def test_queryset_update_and_delete_are_refused(event: Event) -> None:
    qs = Event.objects.filter(pk=event.pk)
    with pytest.raises(ImmutableEventError):
        qs.update(data={"text": "rewritten"})
    with pytest.raises(ImmutableEventError):
        qs.delete()
    with pytest.raises(ImmutableEventError):
        Event.objects.all().delete()
    event.data = {"text": "rewritten"}
    with pytest.raises(ImmutableEventError):
        Event.objects.bulk_update([event], ["data"])
    _unchanged(event)


def test_related_manager_is_guarded_too(event: Event) -> None:
    session = Session.objects.get(pk=event.session_id)
    with pytest.raises(ImmutableEventError):
        session.events.all().delete()
    with pytest.raises(ImmutableEventError):
        session.events.update(kind="turn/start")
    _unchanged(event)


def test_session_with_events_cannot_be_deleted(event: Event) -> None:
    """PROTECT on the foreign key: deleting a session would delete its log."""
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError):
        Session.objects.get(pk=event.session_id).delete()
    _unchanged(event)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sql",
    [
        'UPDATE sessions_app_event SET data = \'{"text": "rewritten"}\'::jsonb WHERE id = %s',
        "UPDATE sessions_app_event SET seq = 99 WHERE id = %s",
        "DELETE FROM sessions_app_event WHERE id = %s",
    ],
)
def test_postgres_trigger_refuses_raw_update_and_delete(event: Event, sql: str) -> None:
    with pytest.raises(DatabaseError, match="append-only") as info, transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql, [event.pk])
    # insufficient_privilege, so clients can tell it from a constraint violation
    assert getattr(info.value.__cause__, "sqlstate", None) == "42501"
    _unchanged(event)


@pytest.mark.postgres
def test_postgres_trigger_is_installed() -> None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tgenabled FROM pg_trigger WHERE tgrelid = 'sessions_app_event'::regclass "
            "AND tgname = 'terret_event_immutable'"
        )
        assert cur.fetchall() == [("O",)]  # enabled (origin)


@pytest.mark.postgres
def test_postgres_allows_appends_through_raw_insert(make_session: Any) -> None:
    """The trigger guards UPDATE/DELETE only: INSERT (the append path's own
    statement) must keep working."""
    s = make_session()
    append(s.id, "turn/start", {})
    append(s.id, "turn/end", {"status": "completed"})
    assert list(Event.objects.filter(session=s).values_list("seq", flat=True)) == [1, 2]
