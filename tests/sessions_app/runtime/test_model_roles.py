"""The session's model-role overrides: a projection of model/updated kept on
the session row, and the migration that filled it for existing logs."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps

from sessions_app import services
from sessions_app.errors import InvalidInput
from sessions_app.log.reads import model_overrides
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.roles import resolve_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(make_user: Any) -> Session:
    profile = AgentProfile.objects.create(name="roles", roles={"main": "profile/main"})
    return services.create_session(make_user(), profile)


def test_the_latest_model_update_per_role_wins(session: Session) -> None:
    assert model_overrides(session.id) == {}
    services.set_model(session.id, "main", "a/one")
    services.set_model(session.id, "titler", "a/titler")
    services.set_model(session.id, "main", "a/two")
    assert model_overrides(session.id) == {"main": "a/two", "titler": "a/titler"}
    assert resolve_spec("main", session.profile, session.id) == "a/two"
    assert resolve_spec("compactor", session.profile, session.id) is None
    # Overrides the caller already holds are used as they are.
    assert resolve_spec("main", session.profile, overrides={}) == "profile/main"


def test_a_bad_role_changes_nothing(session: Session) -> None:
    with pytest.raises(InvalidInput):
        services.set_model(session.id, "boss", "x/y")
    assert Event.objects.filter(session=session, kind="model/updated").count() == 0
    assert model_overrides(session.id) == {}


def test_the_migration_fills_the_columns_from_existing_logs(session: Session, make_user: Any) -> None:
    untouched = services.create_session(make_user(), session.profile)
    services.set_model(session.id, "main", "old/main")
    services.set_model(session.id, "compactor", "x/compactor")
    services.set_model(session.id, "main", "new/main")
    # As a database migrated before the columns existed would hold them.
    Session.objects.update(model_main="", model_titler="", model_compactor="")
    migration = importlib.import_module("sessions_app.migrations.0007_session_model_roles")
    migration.backfill(apps, None)
    assert model_overrides(session.id) == {"main": "new/main", "compactor": "x/compactor"}
    assert model_overrides(untouched.id) == {}
