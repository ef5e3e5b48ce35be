"""The summarizer seam. Morph's failure modes run against a real local HTTP
server (no patches): no key, HTTP errors, torn and malformed responses. Each
declines (None, a warning, nothing appended); success records Morph's usage."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.log.projection import SUMMARY_PREFIX, derive_messages
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.services import compaction
from sessions_app.services.summarizers import (
    History,
    HistoryEvent,
    MorphSummarizer,
    RoleSummarizer,
    SummarizerNotConfigured,
    get_summarizer,
    render_history,
)
from tests.sessions_app.services.conftest import MorphServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def morph_session(make_user: Any, settings: Any) -> Session:
    settings.TERRET_WORKER = "manual"
    profile = AgentProfile.objects.create(name="m", roles={"main": "demo/offline"}, summarizer="morph")
    session = services.create_session(make_user(), profile)
    for kind, data in [
        ("turn/start", {}),
        ("user/message", {"text": "keep this line"}),
        ("assistant/message", {"content": None, "tool_calls": [{"id": "c1", "name": "clock.now", "arguments": "{}"}]}),
        ("tool/result", {"call_id": "c1", "name": "clock.now", "content": "2026-01-01T00:00:00Z"}),
        ("assistant/message", {"content": "It is new year."}),
        ("turn/end", {"status": "completed"}),
    ]:
        log.append(session.id, kind, data)
    return session


def _kinds(session: Session) -> list[str]:
    return list(Event.objects.filter(session=session).order_by("seq").values_list("kind", flat=True))


def test_morph_success_compacts_and_records_unpriced_usage(morph: MorphServer, morph_session: Session) -> None:
    result = compaction.compact(morph_session.id, manual=True)
    assert result is not None and result.model == "morph/morph-compactor"
    preamble = compaction.TASK_HEADING + "keep this line\n\n"  # the task survives, verbatim
    assert derive_messages(morph_session.id) == [
        {"role": "user", "content": SUMMARY_PREFIX + preamble + "[user] keep this line\n(filtered 3 lines)"}
    ]
    usage = Event.objects.get(session=morph_session, kind="usage/recorded").data
    assert usage == {
        "purpose": "compaction",
        "model": "morph/morph-compactor",
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "cost": None},
    }
    s = Session.objects.get(id=morph_session.id)
    assert (s.prompt_tokens, s.unpriced_entries) == (120, 1)  # unpriced, never $0
    # the wire format
    (req,) = morph.requests
    assert req["path"] == "/v1/compact"
    assert req["headers"]["Authorization"] == "Bearer morph-test-key"
    body = req["body"]
    assert body["model"] == "morph-compactor" and body["query"] == "keep this line"
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert body["messages"][1]["content"].startswith("[assistant tool call c1] clock.now {}")
    assert body["messages"][2]["content"] == "[tool result c1 clock.now ok] 2026-01-01T00:00:00Z"


@pytest.mark.parametrize("mode", ["http_error", "auth_error", "torn", "not_json", "no_output"])
def test_morph_failures_decline_and_append_nothing(
    morph: MorphServer, morph_session: Session, mode: str, caplog: Any
) -> None:
    morph.mode = mode
    before = _kinds(morph_session)
    with caplog.at_level(logging.WARNING, logger="sessions_app.services.summarizers"):
        outcome = compaction.attempt(morph_session.id, manual=True)  # manual: Morph still declines, never raises
    assert outcome == compaction.Declined("the morph summarizer declined")
    assert _kinds(morph_session) == before
    assert len(morph.requests) == 1
    assert any("morph summarizer" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_morph_without_a_key_declines_without_calling(
    morph: MorphServer, morph_session: Session, settings: Any, caplog: Any
) -> None:
    settings.MORPH_API_KEY = ""
    before = _kinds(morph_session)
    with caplog.at_level(logging.WARNING, logger="sessions_app.services.summarizers"):
        assert compaction.compact(morph_session.id, manual=True) is None
    assert morph.requests == [] and _kinds(morph_session) == before
    assert any("MORPH_API_KEY" in r.getMessage() for r in caplog.records)


def test_morph_unreachable_declines(morph_session: Session, settings: Any) -> None:
    settings.MORPH_API_KEY = "k"
    settings.MORPH_BASE_URL = "http://127.0.0.1:9/v1"  # discard port: connection refused
    summarizer = MorphSummarizer()
    history = History(morph_session.id, 1, [HistoryEvent(1, "user/message", {"text": "x"})])
    assert summarizer.summarize(history) is None


def test_morph_failure_in_the_trigger_is_non_fatal_and_retried(morph: MorphServer, morph_session: Session) -> None:
    morph_session.profile.compaction_budget = 10
    morph_session.profile.save()
    log.append(
        morph_session.id, "step/end", {"step": 1, "usage": {"prompt_tokens": 50, "completion_tokens": 1, "cost": 0.0}}
    )
    morph.mode = "http_error"
    assert compaction.maybe_compact(morph_session.id) is None
    morph.mode = "ok"
    assert compaction.maybe_compact(morph_session.id) is not None


def test_get_summarizer_follows_the_profile() -> None:
    assert isinstance(get_summarizer(AgentProfile(name="a", summarizer="morph")), MorphSummarizer)
    assert isinstance(get_summarizer(AgentProfile(name="b", summarizer="role")), RoleSummarizer)
    assert isinstance(get_summarizer(None), RoleSummarizer)


def test_role_summarizer_raises_when_unconfigured(settings: Any) -> None:
    settings.TERRET_MODEL_COMPACTOR = ""
    with pytest.raises(SummarizerNotConfigured):
        RoleSummarizer(AgentProfile(name="x", roles={}), None).summarize(History(uuid.uuid4(), 0))


def test_role_summarizer_with_the_offline_demo_model(settings: Any) -> None:
    settings.TERRET_MODEL_COMPACTOR = "demo/offline"
    history = History(uuid.uuid4(), 1, [HistoryEvent(1, "user/message", {"text": "plan the trip"})])
    summary = RoleSummarizer(None, None).summarize(history)
    assert summary.model == "demo/offline"
    assert "plan the trip" in summary.text and summary.usage is not None


def test_render_history_tags_every_part() -> None:
    history = History(
        uuid.uuid4(),
        9,
        [
            HistoryEvent(1, "session/compacted", {"upto_seq": 0, "summary": "before"}),
            HistoryEvent(2, "context/injected", {"text": "steer"}),
            HistoryEvent(
                3, "assistant/message", {"content": "a\nb", "tool_calls": [{"id": "k", "name": "n", "arguments": ""}]}
            ),
            HistoryEvent(4, "tool/result", {"call_id": "k", "name": "n", "content": "boom", "is_error": True}),
        ],
    )
    assert render_history(history).split("\n") == [
        "[summary of earlier conversation] before",
        "[user] steer",
        "[assistant] a",
        "  b",
        "[assistant tool call k] n {}",
        "[tool result k n error] boom",
    ]
