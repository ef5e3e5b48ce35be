"""Compaction: the projection after it, the race declines, the trigger, and
safe boundaries. The models are a real local HTTP server (FakeLLM); turns run
through the real loop, driven synchronously (TERRET_WORKER=manual)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.errors import SummarizerFailed, SummarizerNotConfigured
from sessions_app.log.projection import SUMMARY_PREFIX, derive_messages
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.drive import drive
from sessions_app.services import compaction
from sessions_app.services.compaction import CompactionResult, Declined
from sessions_app.services.post_turn import post_turn
from sessions_app.services.usage import log_sum, totals_of
from tests.fakes.fake_llm import Reply
from tests.helpers import kinds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def profile() -> AgentProfile:
    return AgentProfile.objects.create(
        name="c",
        roles={"main": "test/main", "compactor": "test/compactor"},
        builtin_tools=["debug.noop", "workspace.write"],
        allow_floor=["*"],
        compaction_budget=1000,
    )


def task(text: str) -> str:
    """The preamble every summary starts with: the session's first user message."""
    return compaction.TASK_HEADING + text + "\n\n"


def last_seq(session: Session) -> int:
    return Session.objects.values_list("last_seq", flat=True).get(id=session.id)


def turn(fake: Any, session: Session, text: str, *replies: Reply) -> str:
    fake.script(*replies)
    services.run_turn(session.id, text)
    return drive(session.id)


def assert_well_formed(messages: list[dict[str, Any]]) -> None:
    """What a provider insists on: every tool message answers a call of the
    assistant message before it, and every call is answered before the next
    user or assistant message."""
    owed: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in owed, f"orphan tool result {m['tool_call_id']}"
            owed.discard(m["tool_call_id"])
            continue
        assert not owed, f"calls {owed} unanswered before a {m['role']} message"
        if m["role"] == "assistant":
            owed = {c["id"] for c in m.get("tool_calls") or []}
    assert not owed, f"calls {owed} unanswered"


# ---------------------------------------------------------------- projection


def test_derive_messages_after_compaction(fake_llm: Any, session: Session) -> None:
    assert (
        turn(fake_llm, session, "first question", Reply(tool_calls=[("debug.noop", {})]), Reply(text="answer one"))
        == "ended"
    )
    before = derive_messages(session.id)
    assert [m["role"] for m in before] == ["user", "assistant", "tool", "assistant"]
    head = last_seq(session)
    fake_llm.script(Reply(text="The user asked a first question; noop was called.", usage=(40, 9, 0.002)))

    result = compaction.compact(session.id, manual=True)

    assert isinstance(result, CompactionResult)
    assert result.upto_seq == head and result.seq == head + 1
    assert kinds(session, head) == ["session/compacted", "usage/recorded"]
    data = Event.objects.get(session=session, seq=result.seq).data
    assert data == {
        "upto_seq": head,
        "summary": task("first question") + "The user asked a first question; noop was called.",
    }
    # the model now sees only the summary ...
    assert derive_messages(session.id) == [{"role": "user", "content": SUMMARY_PREFIX + data["summary"]}]
    # ... then whatever follows it
    assert turn(fake_llm, session, "second question", Reply(text="answer two")) == "ended"
    after = derive_messages(session.id)
    assert after[0]["content"].startswith(SUMMARY_PREFIX)
    assert after[1:] == [{"role": "user", "content": "second question"}, {"role": "assistant", "content": "answer two"}]
    # and the main model got exactly that view (after its system prompt)
    assert fake_llm.requests[-1]["messages"][1:] == after[:2]


def test_summarizer_sees_every_part_role_tagged(fake_llm: Any, session: Session) -> None:
    turn(
        fake_llm,
        session,
        "please noop\nwith two lines",
        Reply(text="calling", tool_calls=[("debug.noop", {})]),
        Reply(text="noop done"),
    )
    fake_llm.script(Reply(text="summary"))
    compaction.compact(session.id, manual=True)
    request = fake_llm.requests[-1]
    assert request["model"] == "test/compactor"
    system, user = request["messages"]
    assert system["role"] == "system" and "summar" in system["content"].lower()
    lines = user["content"].split("\n")
    assert lines[0] == "[user] please noop"
    assert lines[1] == "  with two lines"  # a continuation is indented, never a tag of its own
    assert lines[2] == "[assistant] calling"
    assert lines[3].startswith("[assistant tool call call_") and lines[3].endswith("] debug.noop {}")
    assert lines[4].startswith("[tool result call_") and " debug.noop ok] " in lines[4]
    assert lines[5] == "[assistant] noop done"


def test_second_compaction_summarizes_the_first_and_what_followed(fake_llm: Any, session: Session) -> None:
    turn(fake_llm, session, "one", Reply(text="r1"))
    fake_llm.script(Reply(text="S1"))
    first = compaction.compact(session.id, manual=True)
    turn(fake_llm, session, "two", Reply(text="r2"))
    fake_llm.script(Reply(text="S2"))
    second = compaction.compact(session.id, manual=True)
    assert first is not None and second is not None and second.upto_seq > first.seq
    rendered = fake_llm.requests[-1]["messages"][1]["content"]
    # the previous summary's preamble is not summarized again: it is prepended again
    assert rendered.split("\n") == ["[summary of earlier conversation] S1", "[user] two", "[assistant] r2"]
    assert derive_messages(session.id) == [{"role": "user", "content": SUMMARY_PREFIX + task("one") + "S2"}]


def test_nothing_to_compact_declines_without_a_model_call(fake_llm: Any, session: Session) -> None:
    head = last_seq(session)
    assert compaction.attempt(session.id, manual=True) == Declined("nothing new to compact")
    assert last_seq(session) == head and fake_llm.requests == []


def test_compaction_never_resets_cost(fake_llm: Any, session: Session) -> None:
    turn(fake_llm, session, "q", Reply(text="a", usage=(100, 10, 0.01)))
    fake_llm.script(Reply(text="S", usage=(50, 5, 0.003)))
    compaction.compact(session.id, manual=True)
    turn(fake_llm, session, "q2", Reply(text="a2", usage=(20, 2, None)))
    s = Session.objects.get(id=session.id)
    assert (s.prompt_tokens, s.completion_tokens, s.steps, s.unpriced_entries) == (170, 17, 2, 1)
    assert float(s.cost) == pytest.approx(0.013)
    assert totals_of(s) == log_sum(session.id)


# ---------------------------------------------------------------- races


def _compact_in_thread(session: Session) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = compaction.attempt(session.id, manual=True)
        except Exception as exc:  # surfaced by the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _wait_for_requests(fake: Any, n: int) -> None:
    for _ in range(500):
        if len(fake.requests) >= n:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"expected {n} model requests, saw {len(fake.requests)}")


def test_turn_opening_while_summarizing_declines(fake_llm: Any, session: Session) -> None:
    turn(fake_llm, session, "one", Reply(text="r1"))
    release = threading.Event()
    fake_llm.script(Reply(text="a summary that arrives late", hang=release, usage=(30, 3, 0.001)))
    thread, out = _compact_in_thread(session)
    _wait_for_requests(fake_llm, 2)  # the summarizer is mid-request
    head = last_seq(session)
    services.run_turn(session.id, "a new turn opens")
    release.set()
    thread.join(10)
    assert out.get("result") == Declined("a turn is open; compaction happens between turns")
    # no session/compacted; the summarizer's spend is still on the books
    assert kinds(session, head) == ["turn/start", "user/message", "usage/recorded"]
    assert derive_messages(session.id)[-1] == {"role": "user", "content": "a new turn opens"}


def test_whole_turn_while_summarizing_declines(fake_llm: Any, session: Session) -> None:
    """A turn that opened *and closed* during summarization leaves no turn open,
    but its model-visible events are not in the summary: decline."""
    turn(fake_llm, session, "one", Reply(text="r1"))
    release = threading.Event()
    fake_llm.script(Reply(text="late summary", hang=release))
    thread, out = _compact_in_thread(session)
    _wait_for_requests(fake_llm, 2)
    assert turn(fake_llm, session, "quick one", Reply(text="quick answer")) == "ended"
    release.set()
    thread.join(10)
    assert out.get("result") == Declined("model-visible events arrived while summarizing")
    assert "session/compacted" not in kinds(session)
    assert derive_messages(session.id)[-1] == {"role": "assistant", "content": "quick answer"}


def test_two_concurrent_compactions_one_wins(fake_llm: Any, session: Session) -> None:
    turn(fake_llm, session, "one", Reply(text="r1"))
    release = threading.Event()
    fake_llm.script(Reply(text="slow summary", hang=release), Reply(text="fast summary"))
    thread, out = _compact_in_thread(session)
    _wait_for_requests(fake_llm, 2)
    fast = compaction.attempt(session.id, manual=True)
    assert isinstance(fast, CompactionResult) and fast.summary == task("one") + "fast summary"
    release.set()
    thread.join(10)
    assert out.get("result") == Declined("model-visible events arrived while summarizing")
    assert kinds(session).count("session/compacted") == 1
    assert derive_messages(session.id) == [{"role": "user", "content": SUMMARY_PREFIX + task("one") + "fast summary"}]


def test_manual_compaction_during_a_live_turn_declines_without_a_model_call(fake_llm: Any, session: Session) -> None:
    turn(fake_llm, session, "one", Reply(text="r1"))
    services.run_turn(session.id, "running now")  # open, not yet driven
    head, requests = last_seq(session), len(fake_llm.requests)
    assert compaction.compact(session.id, manual=True) is None
    assert last_seq(session) == head and len(fake_llm.requests) == requests


# ---------------------------------------------------------------- errors


def test_unconfigured_role_raises_for_manual_and_is_isolated_in_the_trigger(
    fake_llm: Any, session: Session, profile: AgentProfile, settings: Any
) -> None:
    settings.TERRET_MODEL_COMPACTOR = ""
    profile.roles = {"main": "test/main"}
    profile.compaction_budget = 10
    profile.save()
    assert turn(fake_llm, session, "one", Reply(text="r1", usage=(500, 5, 0.001))) == "ended"
    head = last_seq(session)
    with pytest.raises(SummarizerNotConfigured):
        compaction.compact(session.id, manual=True)
    assert compaction.compact(session.id, manual=False) is None
    post_turn(session.id)  # the trigger: over budget, fails quietly (titles the session, nothing else)
    assert "session/compacted" not in kinds(session)
    assert kinds(session, head) == ["session/titled"]


def test_model_failure_raises_for_manual_then_the_next_overweight_turn_retries(
    fake_llm: Any, session: Session, profile: AgentProfile
) -> None:
    profile.compaction_budget = 100
    profile.save()
    assert turn(fake_llm, session, "one", Reply(text="r1", usage=(500, 5, 0.001))) == "ended"
    fake_llm.script(Reply(status=500))
    with pytest.raises(SummarizerFailed):
        compaction.compact(session.id, manual=True)
    fake_llm.script(Reply(status=500))
    post_turn(session.id)  # automatic: isolated
    assert "session/compacted" not in kinds(session)
    assert turn(fake_llm, session, "two", Reply(text="r2", usage=(900, 5, 0.001))) == "ended"
    fake_llm.script(Reply(text="finally a summary"))
    post_turn(session.id)
    assert kinds(session).count("session/compacted") == 1


# ---------------------------------------------------------------- trigger


def test_trigger_fires_at_budget_and_only_once(fake_llm: Any, session: Session, profile: AgentProfile) -> None:
    profile.compaction_budget = 300
    profile.save()
    turn(fake_llm, session, "small", Reply(text="r", usage=(299, 1, 0.0)))
    post_turn(session.id)
    assert "session/compacted" not in kinds(session)
    turn(fake_llm, session, "big", Reply(text="r", usage=(300, 1, 0.0)))
    fake_llm.script(Reply(text="S"))
    post_turn(session.id)
    assert kinds(session).count("session/compacted") == 1
    post_turn(session.id)  # a retried task: the last step predates the compaction
    assert kinds(session).count("session/compacted") == 1


def test_trigger_uses_the_last_step_of_the_turn(fake_llm: Any, session: Session, profile: AgentProfile) -> None:
    profile.compaction_budget = 300
    profile.save()
    turn(
        fake_llm,
        session,
        "go",
        Reply(tool_calls=[("debug.noop", {})], usage=(350, 1, 0.0)),
        Reply(text="done", usage=(200, 1, 0.0)),
    )
    assert compaction.over_budget(session.id) is False


def test_post_turn_runs_on_the_in_process_pool(
    fake_llm: Any, session: Session, profile: AgentProfile, settings: Any
) -> None:
    """TERRET_WORKER=inprocess: the pool thread that drove the turn runs
    post_turn after releasing the lease; titling and compaction happen there."""
    profile.compaction_budget = 100
    profile.save()
    settings.TERRET_WORKER = "inprocess"
    fake_llm.script(Reply(text="r", usage=(150, 1, 0.0)), Reply(text="pool summary"))
    services.run_turn(session.id, "hello pool")
    for _ in range(500):
        if "session/compacted" in kinds(session):
            break
        threading.Event().wait(0.02)
    assert kinds(session).count("session/compacted") == 1
    assert Session.objects.get(id=session.id).title == "hello pool"


# ---------------------------------------------------------------- safe boundaries


def test_pending_approval_is_never_compacted(fake_llm: Any, session: Session) -> None:
    turn(fake_llm, session, "one", Reply(text="r1"))
    assert (
        turn(fake_llm, session, "write it", Reply(tool_calls=[("workspace.write", {"path": "a", "content": "b"})]))
        == "parked"
    )
    head, requests = last_seq(session), len(fake_llm.requests)
    assert compaction.attempt(session.id, manual=True) == Declined("a turn is open; compaction happens between turns")
    assert last_seq(session) == head and len(fake_llm.requests) == requests
    messages = derive_messages(session.id)
    assert messages[-1]["tool_calls"][0]["function"]["name"] == "workspace.write"  # still visible, still owed


def test_call_and_result_stay_together_across_compactions(fake_llm: Any, session: Session) -> None:
    """Boundaries fall between turns, so no compaction separates a call from
    its result: every derived view stays well formed."""
    turn(
        fake_llm,
        session,
        "one",
        Reply(tool_calls=[("debug.noop", {})]),
        Reply(tool_calls=[("debug.noop", {})]),
        Reply(text="r1"),
    )
    fake_llm.script(Reply(text="S1"))
    first = compaction.compact(session.id, manual=True)
    assert first is not None
    # every call at or before the boundary has its result at or before it too
    calls = results = 0
    for kind, data in Event.objects.filter(session=session, seq__lte=first.upto_seq).values_list("kind", "data"):
        if kind == "assistant/message":
            calls += len(data.get("tool_calls") or [])
        elif kind == "tool/result":
            results += 1
    assert calls == results == 2
    turn(fake_llm, session, "two", Reply(tool_calls=[("debug.noop", {})]), Reply(text="r2"))
    messages = derive_messages(session.id)
    assert_well_formed(messages)
    assert [m["role"] for m in messages] == ["user", "user", "assistant", "tool", "assistant"]


def test_cancelled_turn_with_owed_calls_compacts_cleanly(fake_llm: Any, session: Session) -> None:
    assert (
        turn(fake_llm, session, "write", Reply(tool_calls=[("workspace.write", {"path": "a", "content": "b"})]))
        == "parked"
    )
    services.cancel(session.id)
    drive(session.id)
    assert Session.objects.get(id=session.id).open_turn_seq is None
    fake_llm.script(Reply(text="S"))
    result = compaction.compact(session.id, manual=True)
    assert result is not None
    assert_well_formed(derive_messages(session.id))
    turn(fake_llm, session, "next", Reply(text="ok"))
    assert_well_formed(derive_messages(session.id))


def test_boundary_check_under_the_lock_sees_a_pending_approval(session: Session) -> None:
    """The decision itself: a row with an open turn or a pending approval is refused."""
    log.append(session.id, "turn/start", {})
    log.append(session.id, "user/message", {"text": "x"})
    log.append(
        session.id, "assistant/message", {"content": None, "tool_calls": [{"id": "c1", "name": "t", "arguments": "{}"}]}
    )
    log.append(session.id, "approval/requested", {"call_id": "c1", "name": "t", "args": {}})
    with log.locked(session.id) as tx:
        assert compaction.boundary_problem(tx.row, session.id, tx.row["last_seq"]) is not None
    log.append(session.id, "tool/result", {"call_id": "c1", "name": "t", "content": "ok"})
    log.append(session.id, "turn/end", {"status": "completed"})
    with log.locked(session.id) as tx:
        assert compaction.boundary_problem(tx.row, session.id, tx.row["last_seq"]) is None
        assert compaction.boundary_problem(tx.row, session.id, tx.row["last_seq"] - 2) == (
            "model-visible events arrived while summarizing"
        )


@pytest.fixture(autouse=True)
def no_llm_retries(settings: Any) -> None:
    settings.TERRET_LLM_RETRIES = 0
