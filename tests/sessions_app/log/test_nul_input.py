"""NUL characters cannot be stored in Postgres text or jsonb: every way in
refuses them with a clear error and appends nothing, on both backends."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.errors import InvalidInput
from sessions_app.log import InvalidPayload
from sessions_app.models import AgentProfile, Event

pytestmark = pytest.mark.django_db(transaction=True)


def test_append_refuses_nul_anywhere_in_the_payload(make_session: Any) -> None:
    session = make_session()
    with pytest.raises(InvalidPayload, match="NUL"):
        log.append(session.id, "user/message", {"text": "a\x00b"})
    with pytest.raises(InvalidPayload, match="NUL"):
        log.append_many(
            session.id,
            [("turn/start", {}), ("approval/requested", {"call_id": "c", "name": "n", "args": {"k\x00": 1}})],
        )
    assert not Event.objects.filter(session=session).exists()
    # a literal backslash-u sequence is ordinary text
    log.append(session.id, "user/message", {"text": "\\u0000 is how JSON spells NUL"})
    assert Event.objects.filter(session=session).count() == 1


def test_append_refuses_a_lone_surrogate_anywhere_in_the_payload(make_session: Any) -> None:
    session = make_session()
    with pytest.raises(InvalidPayload, match="lone surrogates"):
        log.append(session.id, "user/message", {"text": "a\ud800b"})
    with pytest.raises(InvalidPayload, match="lone surrogates"):
        log.append_many(
            session.id,
            [("turn/start", {}), ("approval/requested", {"call_id": "c", "name": "n", "args": {"k\udfff": 1}})],
        )
    assert not Event.objects.filter(session=session).exists()
    log.append(session.id, "user/message", {"text": "JSON's pair \\ud83d\\ude00 decodes to one character: 😀"})
    assert Event.objects.filter(session=session).count() == 1


def test_inject_refuses_nul(make_user: Any, settings: Any) -> None:
    settings.TERRET_WORKER = "manual"
    session = services.create_session(make_user(), AgentProfile.objects.create(name="nul"))
    before = Event.objects.filter(session=session).count()
    with pytest.raises(InvalidInput, match="NUL"):
        services.inject(session.id, "hi\x00", wake=True)
    assert Event.objects.filter(session=session).count() == before


def test_api_refuses_nul_with_a_4xx(make_user: Any, client: Any) -> None:
    AgentProfile.objects.get_or_create(name="demo")
    user = make_user("nul")
    client.force_login(user)
    before = Event.objects.count()
    response = client.post("/api/sessions", {"profile": "demo\x00"}, content_type="application/json")
    assert 400 <= response.status_code < 500
    assert Event.objects.count() == before
