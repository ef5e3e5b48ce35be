"""Titling: exactly one session/titled per session, at the first turn/end.
The titler is a real local HTTP server (FakeLLM); turns run through the loop."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sessions_app import services
from sessions_app.log.projection import derive_messages
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.drive import drive
from sessions_app.services import titling
from sessions_app.services.post_turn import post_turn
from tests.fakes.fake_llm import Reply

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

LONG = "Please help me plan a three week trip through Portugal and Spain by train"


def _session(make_user: Any, **roles: str) -> Session:
    profile = AgentProfile.objects.create(name=f"p{AgentProfile.objects.count()}", roles={"main": "test/main", **roles})
    return services.create_session(make_user(), profile)


def _first_turn(fake: Any, session: Session, text: str = LONG) -> None:
    fake.script(Reply(text="Sure, let us plan it.", usage=(10, 5, 0.001)))
    services.run_turn(session.id, text)
    assert drive(session.id) == "ended"


def titles(session: Session) -> list[str]:
    return [
        d["title"] for d in Event.objects.filter(session=session, kind="session/titled").values_list("data", flat=True)
    ]


def test_titler_role_writes_the_title(fake_llm: Any, make_user: Any) -> None:
    session = _session(make_user, titler="test/titler")
    _first_turn(fake_llm, session)
    fake_llm.script(Reply(text='"Iberian rail trip"\n', usage=(30, 4, 0.0002)))
    post_turn(session.id)
    assert titles(session) == ["Iberian rail trip"]
    assert Session.objects.get(id=session.id).title == "Iberian rail trip"
    request = fake_llm.requests[-1]
    assert request["model"] == "test/titler"
    assert "title" in request["messages"][0]["content"].lower()
    assert LONG in request["messages"][1]["content"]
    # its usage is on the books, marked as a title request
    recorded = Event.objects.get(session=session, kind="usage/recorded").data
    assert recorded == {
        "purpose": "title",
        "model": "test/titler",
        "usage": {"prompt_tokens": 30, "completion_tokens": 4, "cost": 0.0002},
    }
    # the title comes after the first turn/end and is never model-visible
    kinds = list(Event.objects.filter(session=session).order_by("seq").values_list("kind", flat=True))
    assert kinds.index("session/titled") > kinds.index("turn/end")
    assert all("Iberian" not in str(m.get("content")) for m in derive_messages(session.id))


def test_fallback_is_the_first_user_message_truncated_to_40(fake_llm: Any, make_user: Any) -> None:
    session = _session(make_user)
    _first_turn(fake_llm, session, "  " + LONG.replace(" three", "\n three"))
    requests = len(fake_llm.requests)
    post_turn(session.id)
    assert titles(session) == [LONG[:40].rstrip()]
    assert len(titles(session)[0]) <= 40
    assert len(fake_llm.requests) == requests  # no titler call without a titler
    assert not Event.objects.filter(session=session, kind="usage/recorded").exists()


def test_short_first_message_is_the_title_as_is(fake_llm: Any, make_user: Any) -> None:
    session = _session(make_user)
    _first_turn(fake_llm, session, "hi there")
    post_turn(session.id)
    assert titles(session) == ["hi there"]


def test_titler_answer_is_capped_at_80(fake_llm: Any, make_user: Any) -> None:
    session = _session(make_user, titler="test/titler")
    _first_turn(fake_llm, session)
    fake_llm.script(Reply(text="word " * 40))
    post_turn(session.id)
    (title,) = titles(session)
    assert len(title) <= 80 and title.startswith("word word")
    assert len(Session.objects.get(id=session.id).title) <= 80


def test_failing_titler_falls_back(fake_llm: Any, make_user: Any) -> None:
    session = _session(make_user, titler="test/titler")
    _first_turn(fake_llm, session)
    fake_llm.script(Reply(status=500))
    post_turn(session.id)
    assert titles(session) == [LONG[:40].rstrip()]


def test_demo_model_as_titler(fake_llm: Any, make_user: Any) -> None:
    session = _session(make_user, titler="demo/offline")
    _first_turn(fake_llm, session, "what time is it in Lisbon right now please")
    post_turn(session.id)
    assert titles(session) == ["What time is it in lisbon"]


def test_exactly_one_title_across_turns_and_retries(fake_llm: Any, make_user: Any) -> None:
    session = _session(make_user)
    _first_turn(fake_llm, session, "first message")
    post_turn(session.id)
    post_turn(session.id)  # a retried task
    fake_llm.script(Reply(text="again"))
    services.run_turn(session.id, "second message")
    drive(session.id)
    post_turn(session.id)  # a later turn/end
    assert titles(session) == ["first message"]


def test_exactly_one_title_with_concurrent_workers(fake_llm: Any, make_user: Any) -> None:
    """Four workers all see no title, all ask the titler (slowly), and race to
    append: the row lock lets exactly one title in; every spend is recorded."""
    session = _session(make_user, titler="test/titler")
    _first_turn(fake_llm, session)
    fake_llm.script(*[Reply(text=f"Title {i}", latency=0.3, usage=(5, 1, 0.0001)) for i in range(4)])
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            titling.ensure_title(session.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(titles(session)) == 1
    assert titles(session)[0].startswith("Title ")
    assert Event.objects.filter(session=session, kind="usage/recorded", data__purpose="title").count() == 4


def test_no_user_text_yet_defers(make_user: Any) -> None:
    session = _session(make_user)
    assert titling.ensure_title(session.id) is None
    assert titles(session) == []


def test_clean() -> None:
    assert titling.clean('  "Title: A neat   title"  ') == "A neat title"
    assert titling.clean("\n\nfirst line\nsecond") == "first line"
    assert titling.clean("x" * 200) == "x" * 80


def test_post_turn_with_the_runners_facts(fake_llm: Any, make_user: Any, django_assert_num_queries: Any) -> None:
    from sessions_app.services.post_turn import TurnFacts

    session = _session(make_user)
    _first_turn(fake_llm, session, "first message")
    profile = session.profile
    assert profile is not None
    # Titled and under budget: nothing to read, nothing to write; one indexed
    # look for sessions waiting for the agent slot this turn may have freed.
    with django_assert_num_queries(1):
        post_turn(session.id, TurnFacts(profile, titled=True, first_user_text="x", last_prompt_tokens=10))
    assert titles(session) == []
    # The turn's releasing commit said nobody waits: not even that look.
    with django_assert_num_queries(0):
        post_turn(session.id, TurnFacts(profile, titled=True, last_prompt_tokens=10, slots_wanted=False))
    # It said someone waits: offer_slots looks (and finds none now), as without the fact.
    with django_assert_num_queries(1):
        post_turn(session.id, TurnFacts(profile, titled=True, last_prompt_tokens=10, slots_wanted=True))
    # Untitled: the fallback title comes from the facts' first user text.
    facts = TurnFacts(profile, titled=False, first_user_text="what the runner saw", last_prompt_tokens=10)
    post_turn(session.id, facts)
    post_turn(session.id, facts)  # stale facts (a title landed since): the guard writes nothing
    assert titles(session) == ["what the runner saw"]


@pytest.fixture(autouse=True)
def no_retries_and_no_titler(settings: Any) -> None:
    settings.TERRET_LLM_RETRIES = 0
    settings.TERRET_MODEL_TITLER = ""
