"""Sessions that outgrow the model's context window: compaction inside the
turn, before a request that would not fit and after a provider's
context-length error, never splitting a call from its result; what cannot
be brought under the window blocks the turn (context_overflow) for an
operator instead of failing it and every later turn.

The model is the local fake server over HTTP, refusing every request over
its character limit, in each provider's words (FakeLLM.refusal: OpenAI's
with figures and without, Anthropic's, OpenRouter's, a bare code); it is
also the compactor. Requests are counted at the server."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app import log, services
from sessions_app.log.projection import derive_messages
from sessions_app.models import AgentProfile, Event, ModelWindow, Session
from sessions_app.runtime import documents, hooks, lease
from sessions_app.runtime.drive import drive
from tests.fakes.fake_llm import REFUSALS, Reply
from tests.helpers import events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

LIMIT = 60_000  # characters the fake model takes in one request (15,000 "tokens" by its count)
NOTE = 4_000  # what each turn adds
SUMMARY = "Summary: the user sent numbered notes; the agent acknowledged each one."
# The wordings whose refusal states the model's limit.
STATES_LIMIT = ("openai", "anthropic", "openrouter")


def is_summary_request(body: dict[str, Any]) -> bool:
    first = body["messages"][0]
    return first["role"] == "system" and "summar" in (first.get("content") or "").lower()


def main_requests(fake: Any) -> list[dict[str, Any]]:
    return [b for b in fake.requests if not is_summary_request(b)]


def size(body: dict[str, Any]) -> int:
    """The fake's own measure of a request (message text and tool calls)."""
    total = 0
    for m in body["messages"]:
        total += len(m.get("content") or "")
        for c in m.get("tool_calls") or []:
            total += len(c["function"]["name"]) + len(c["function"]["arguments"] or "")
    return total


def assert_well_formed(messages: list[dict[str, Any]]) -> None:
    """What a provider insists on: every tool call answered by a tool
    message right after its assistant message, no tool message without one."""
    owed: list[str] = []
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in owed, f"a result without its call: {m['tool_call_id']}"
            owed.remove(m["tool_call_id"])
            continue
        assert not owed, f"calls without results before a {m['role']} message: {owed}"
        if m["role"] == "assistant":
            owed = [c["id"] for c in m.get("tool_calls") or []]
    assert not owed, f"calls without results at the end: {owed}"


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="window",
        roles={"main": "test/model", "compactor": "test/model"},
        builtin_tools=["workspace.read"],
        allow_floor=["*"],
    )


@pytest.fixture
def model(fake_llm: Any) -> Any:
    """The fake, refusing requests over LIMIT characters: turns get a short
    acknowledgement, the compactor a short summary."""

    def respond(body: dict[str, Any]) -> Reply:
        return Reply(text=SUMMARY if is_summary_request(body) else "noted")

    fake_llm.responder = respond
    fake_llm.max_context_chars = LIMIT
    return fake_llm


def run(session: Session, text: str) -> dict[str, Any]:
    services.run_turn(session.id, text)
    assert drive(session.id) == "ended"
    return events(session, "turn/end")[-1]


def refusals_were_followed_by_compaction(fake: Any) -> list[dict[str, Any]]:
    """The refused main requests, after checking at the server that each was
    followed by a compaction's requests, then by the same step's request again,
    accepted: a refusal never ended in a failure."""
    sent = fake.requests
    refused_ids = {id(b) for b in fake.refused}
    refused = []
    for i, body in enumerate(sent):
        if is_summary_request(body) or id(body) not in refused_ids:
            continue
        refused.append(body)
        after = sent[i + 1 :]
        summaries = 0
        while summaries < len(after) and is_summary_request(after[summaries]):
            summaries += 1
        assert summaries >= 1, f"refused request {i} was not followed by a compaction"
        retry = after[summaries]
        assert id(retry) not in refused_ids, f"the retry of refused request {i} was refused too"
    return refused


@pytest.mark.parametrize("wording", REFUSALS)
def test_forty_turns_of_4kb_against_a_60kb_model_all_complete(model: Any, session: Session, wording: str) -> None:
    """The measured failures of issues 20 and 27 (turn 14 died with the
    provider's context-length error, and every later turn too; with a
    refusal naming no figures, the compactor gave up at a fixed 50,000
    tokens): now the first refusal teaches the window, the stated one or the
    refused request halved, every later overflow is compacted before it is
    sent, and the task is still in what the model sees at the end."""
    model.refusal = wording
    first = "note 0: " + "x" * NOTE
    ends = [run(session, first)]
    ends += [run(session, f"note {i}: " + "y" * NOTE) for i in range(1, 40)]
    assert ends == [{"status": "completed"}] * 40

    compactions = events(session, "session/compacted")
    assert len(compactions) >= 1
    assert all("turn_seq" in c for c in compactions), "compactions inside the turn, at a step boundary"
    learned = events(session, "model/window")
    if wording in STATES_LIMIT:
        # Learned once from the refusal, as stated, and recorded for the model.
        assert [(w["spec"], w["tokens"], w["source"]) for w in learned] == [("test/model", LIMIT // 4, "error")]
        assert ModelWindow.objects.get(spec="test/model").tokens == LIMIT // 4
    else:
        # No figures: half the refused request's estimate, below the real window, above the floor.
        assert learned and all(w["source"] == "refusal" for w in learned)
        tokens = ModelWindow.objects.get(spec="test/model").tokens
        assert tokens == learned[-1]["tokens"]
        assert 4_096 <= tokens < LIMIT // 4
    refused = refusals_were_followed_by_compaction(model)
    assert len(refused) == 1, "after learning the window no request is sent that cannot fit"
    assert all(size(b) > LIMIT for b in refused)
    assert len(main_requests(model)) == 40 + len(refused)  # one retry per refusal, no loop
    final = main_requests(model)[-1]["messages"]
    assert any(first in (m.get("content") or "") for m in final), "the first user message, verbatim"
    assert_well_formed(final)
    # The log keeps everything: the projection is a view, nothing was deleted.
    assert Event.objects.filter(session=session, kind="user/message").count() == 40
    assert events(session, "turn/blocked") == []


def test_a_declared_window_compacts_before_anything_is_refused(
    model: Any, session: Session, profile: AgentProfile
) -> None:
    profile.context_windows = {"main": LIMIT // 4}
    profile.save()
    for i in range(25):
        assert run(session, f"note {i}: " + "z" * NOTE) == {"status": "completed"}
    assert [b for b in main_requests(model) if size(b) > LIMIT] == []
    assert events(session, "session/compacted"), "compacted before the window was reached"
    assert events(session, "model/window") == []


def test_one_turn_of_twenty_steps_with_8kb_results_compacts_mid_turn(
    model: Any, session: Session, settings: Any
) -> None:
    documents.write(session.id, "big.txt", b"r" * 8_000)
    steps = {"n": 0}

    def respond(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return Reply(text=SUMMARY)
        steps["n"] += 1
        if steps["n"] < 20:
            return Reply(tool_calls=[("workspace.read", {"path": "big.txt"})])
        return Reply(text="read it twenty times")

    model.responder = respond
    assert run(session, "read big.txt again and again") == {"status": "completed"}
    assert [e["step"] for e in events(session, "step/end")] == list(range(1, 21))
    compactions = list(
        Event.objects.filter(session=session, kind="session/compacted").values_list("seq", "data").order_by("seq")
    )
    assert compactions, "the turn outgrew the window and was compacted inside it"
    turn_seq = Event.objects.get(session=session, kind="turn/start").seq
    for _, data in compactions:
        assert data["turn_seq"] == turn_seq
        # The boundary is a step boundary: the step/start of the step about
        # to call the model (then only the window it learned), every earlier
        # call answered.
        upto = data["upto_seq"]
        start = Event.objects.filter(session=session, kind="step/start", seq__lte=upto).order_by("-seq").first()
        assert start is not None
        between = Event.objects.filter(session=session, seq__gt=start.seq, seq__lte=upto)
        assert set(between.values_list("kind", flat=True)) <= {"model/window"}
        assert "Current request (verbatim):\nread big.txt again and again" in data["summary"]
    accepted = [b for b in main_requests(model) if size(b) <= LIMIT]
    for body in accepted:
        assert_well_formed(body["messages"])
    assert_well_formed(derive_messages(session.id))
    assert len(events(session, "tool/result")) == 19


def blocked_turn(session: Session) -> dict[str, Any]:
    """The session is blocked: its turn open, no turn/end; its latest turn/blocked."""
    row = Session.objects.get(id=session.id)
    assert row.status == "blocked" and row.open_turn_seq is not None
    assert events(session, "turn/end") == []
    return events(session, "turn/blocked")[-1]


@pytest.mark.parametrize("wording", ["openai", "bare"])
def test_what_cannot_fit_even_compacted_blocks_the_turn_without_looping(
    model: Any, session: Session, profile: AgentProfile, wording: str
) -> None:
    model.refusal = wording
    profile.system_prompt = "Always remember this. " * 3_500  # 77,000 characters: over the limit alone
    profile.save()
    services.run_turn(session.id, "hello")
    assert drive(session.id) == "blocked"
    blocked = blocked_turn(session)
    assert blocked["code"] == "context_overflow" and blocked["attempts"] == 1
    assert "does not fit test/model's context window even after compaction" in blocked["reason"]
    assert len(main_requests(model)) == 2  # refused, compacted, refused again: no third try
    assert len(events(session, "session/compacted")) == 1


@pytest.mark.parametrize("wording", REFUSALS)
def test_a_message_that_cannot_fit_blocks_the_turn_then_input_and_a_retry_move_it_on(
    model: Any, session: Session, wording: str, settings: Any
) -> None:
    """A single user message larger than the floor, to a model whose window
    is smaller than what any compaction keeps of it (the summary repeats the
    task and the current request verbatim, 8,000 characters each): blocked
    `context_overflow`, not failed. New input is taken in and tried, and
    blocks again, visibly; an operator's Retry after the provider's window
    grew completes the turn."""
    settings.TERRET_CONTEXT_FLOOR_TOKENS = 4_096
    model.refusal = wording
    model.max_context_chars = 12_000
    services.run_turn(session.id, "read this: " + "m" * 20_000)  # about 5,700 tokens: over the floor
    assert drive(session.id) == "blocked"
    blocked = blocked_turn(session)
    assert blocked["code"] == "context_overflow"
    assert "even after compaction" in blocked["reason"]
    (window,) = events(session, "model/window")
    assert window["tokens"] == (3_000 if wording in STATES_LIMIT else 4_096)  # stated, or the floor
    assert len(main_requests(model)) == 2 and len(model.refused) == 2
    assert len(events(session, "session/compacted")) == 1

    # New input unblocks the turn; it rides in, is compacted, and the turn blocks again: said, not silent.
    before = len(model.requests)
    services.inject(session.id, "and this too")
    assert Session.objects.get(id=session.id).status == "running"
    assert drive(session.id) == "blocked"
    again = blocked_turn(session)
    assert again["code"] == "context_overflow" and again["attempts"] == 2
    assert len(events(session, "turn/blocked")) == 2
    assert len(events(session, "context/injected")) == 1
    assert len(events(session, "session/compacted")) == 2
    assert len([b for b in model.requests[before:] if not is_summary_request(b)]) == 1  # one try, no loop

    # The provider's window grew; an operator's Retry moves the turn on.
    model.max_context_chars = None
    services.retry(session.id, by="ops")
    assert drive(session.id) == "ended"
    assert events(session, "turn/end")[-1] == {"status": "completed"}
    assert Session.objects.get(id=session.id).status == "idle"
    # The refused steps were refused, not interrupted: no spend recorded as unknown.
    assert [u for u in events(session, "usage/recorded") if u["purpose"] == "step"] == []


def test_a_turn_resumed_after_a_compaction_inside_it_sees_the_summary_and_keeps_its_steps(
    model: Any, session: Session
) -> None:
    """A worker that dies after compacting mid-turn: the next one loads the
    turn's events from before the compaction (its steps, its calls) and the
    model's view from the compaction on."""
    services.run_turn(session.id, "first, a long note: " + "n" * 2_000)
    held = lease.claim(session.id)
    assert held is not None and held.workload.open_turn_seq is not None
    turn_seq = held.workload.open_turn_seq
    log.append(session.id, "step/start", {"step": 1, "model": "test/model"}, fence=held.fence)
    assert hooks.compact_in_turn(session.id, held.fence, turn_seq) is None
    log.append(session.id, "step/start", {"step": 2, "model": "test/model"}, fence=held.fence)
    lease.release(held)  # the worker is gone; the next drive resumes

    model.requests.clear()
    assert drive(session.id) == "ended"
    assert events(session, "turn/end") == [{"status": "completed"}]
    # Numbering went on past the steps the dead worker opened.
    assert [e["step"] for e in events(session, "step/start")] == [1, 2, 3]
    (request,) = main_requests(model)
    assert request["messages"][1]["content"].startswith("Summary of the conversation so far:\n")
    assert SUMMARY in request["messages"][1]["content"]
    assert len(request["messages"]) == 2, "nothing from before the compaction but its summary"


def test_policy_and_model_roles_outlive_a_compaction_inside_the_turn(
    model: Any, session: Session, profile: AgentProfile
) -> None:
    """Metadata is never summarised: the model role and the allow-list a
    session set before the compaction are still the ones in force after it."""
    profile.context_windows = {"main": LIMIT // 4}
    profile.save()
    services.set_model(session.id, "main", "test/model-b", by="owner")
    log.append(session.id, "policy/updated", {"patterns": ["workspace.*"], "by": "owner"})
    for i in range(14):
        assert run(session, f"note {i}: " + "p" * NOTE) == {"status": "completed"}
    assert events(session, "session/compacted"), "compacted inside a turn"
    last = Event.objects.filter(session=session, kind="step/start").order_by("-seq").first()
    assert last is not None and last.data["model"] == "test/model-b"
    assert main_requests(model)[-1]["model"] == "test/model-b"
    row = Session.objects.get(id=session.id)
    assert row.model_main == "test/model-b"
    assert row.policy_seq == Event.objects.get(session=session, kind="policy/updated").seq
