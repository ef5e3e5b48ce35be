"""The demo profile works offline, every button included (issue 12): its
migration names demo/offline as the titler and the compactor."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.models import AgentProfile
from sessions_app.services import compaction
from tests.helpers import kinds

# Not transactional: the data migration's demo profile is in the database.
pytestmark = pytest.mark.django_db


def test_the_demo_profile_titles_and_compacts_with_the_offline_model(make_user: Any, settings: Any) -> None:
    settings.TERRET_WORKER = "manual"
    settings.TERRET_MODEL_COMPACTOR = ""
    settings.TERRET_MODEL_TITLER = ""
    demo = AgentProfile.objects.get(name="demo")
    assert demo.roles["titler"] == "demo/offline" and demo.roles["compactor"] == "demo/offline"
    session = services.create_session(make_user(), demo)
    for text in ("hello", "tell me about the weather", "and tomorrow?"):
        log.append_many(
            session.id,
            [
                ("turn/start", {}),
                ("user/message", {"text": text}),
                ("assistant/message", {"content": f"an answer to {text}", "tool_calls": []}),
                ("turn/end", {"status": "completed"}),
            ],
        )
    result = compaction.compact(session.id, manual=True)
    assert result is not None
    assert "session/compacted" in kinds(session)
