"""Summaries that scale: a history many times the compactor's window is
summarized in chunks and merged; oversize parts are cut with a marker; a
compactor that refuses a request as too long is tried again with a
smaller budget (the stated limit, or the refused request halved, down to a
floor); Morph gets input within its limit; every request's usage is
recorded; the task survives any number of compactions verbatim; and a
compaction can run inside an open turn, under the turn's lease.

The compactor is the local FakeLLM over HTTP (its max_context_chars plays a
provider's context window); Morph is a local HTTP server. Real PostgreSQL."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from sessions_app import log
from sessions_app.errors import LeaseLost, SummarizerFailed
from sessions_app.log.projection import SUMMARY_PREFIX, derive_messages
from sessions_app.models import AgentProfile, Event, ModelWindow, Session
from sessions_app.runtime import lease, windows
from sessions_app.services import compaction
from sessions_app.services.summarizers import (
    CHUNK_SYSTEM_PROMPT,
    MAX_PART_CHARS,
    MERGE_SYSTEM_PROMPT,
    MORPH_MAX_INPUT_CHARS,
    SUMMARY_SYSTEM_PROMPT,
    History,
    HistoryEvent,
    MorphSummarizer,
    render_history,
)
from tests.fakes.fake_llm import Reply, request_size
from tests.helpers import events, kinds
from tests.sessions_app.services.conftest import MorphServer

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

# A spec of these tests' own: no window learned for it elsewhere in this process.
COMPACTOR = "test/scaling-compactor"
WINDOW = 2_000  # tokens: a small compactor, so ten windows of history stay quick
FIRST = "Plan the migration of the billing service.\n  Keep the old API alive; café ✓ — until June."


@pytest.fixture(autouse=True)
def no_llm_retries(settings: Any) -> None:
    settings.TERRET_LLM_RETRIES = 0


@pytest.fixture
def profile() -> AgentProfile:
    return AgentProfile.objects.create(
        name="scale",
        roles={"main": "test/model", "compactor": COMPACTOR},
        builtin_tools=["debug.noop"],
        allow_floor=["*"],
        context_windows={"compactor": WINDOW},
    )


def add_turn(session: Session, text: str, tools: int = 1, result_chars: int = 300, tag: str = "") -> None:
    """A completed turn: the user's text, `tools` calls with results of
    `result_chars` characters each, and a final answer."""
    batch: list[tuple[str, dict[str, Any]]] = [("turn/start", {}), ("user/message", {"text": text})]
    for n in range(tools):
        call = f"call_{tag}{n}"
        batch.append(
            (
                "assistant/message",
                {
                    "content": f"looking into step {n} of {text[:30]}",
                    "tool_calls": [{"id": call, "name": "debug.noop", "arguments": json.dumps({"n": n})}],
                },
            )
        )
        body = (f"result {n} of {tag}: " + "lorem ipsum dolor sit amet " * (result_chars // 27 + 1))[:result_chars]
        batch.append(("tool/result", {"call_id": call, "name": "debug.noop", "content": body}))
    batch.append(("assistant/message", {"content": f"done with {text[:30]}"}))
    batch.append(("turn/end", {"status": "completed"}))
    log.append_many(session.id, batch)


def usage_count(session: Session) -> int:
    return len(events(session, "usage/recorded"))


def user_content(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def system_content(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


def fits_window(body: dict[str, Any], window: int) -> bool:
    return windows.fits(windows.estimate_tokens(body["messages"]), window)


def preamble(first: str = FIRST) -> str:
    return compaction.TASK_HEADING + first + "\n\n"


def numbered(body: dict[str, Any]) -> Reply:
    """A short summary naming the request's first line, so merges can be traced."""
    return Reply(text="summary of " + user_content(body).split("\n", 1)[0][:60], usage=(100, 10, 0.001))


# ---------------------------------------------------------------- chunks and merges


def test_history_ten_windows_long_is_summarized_in_chunks(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST, tools=2, tag="a")
    for t in range(60):
        add_turn(session, f"turn {t}: carry on with the migration, part {t}", tools=2, result_chars=500, tag=f"t{t}")
    head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
    history = compaction.snapshot(session.id, head)
    assert len(render_history(history)) >= 10 * WINDOW * 3.5  # ten windows of text
    fake_llm.responder = numbered

    result = compaction.compact(session.id, manual=True)

    assert result is not None
    requests = fake_llm.requests
    chunks = [r for r in requests if system_content(r) == CHUNK_SYSTEM_PROMPT]
    merges = [r for r in requests if system_content(r) == MERGE_SYSTEM_PROMPT]
    n = len(chunks)
    assert n >= 10 and len(merges) == 1 and len(requests) == n + 1
    assert requests[-1] is not None and system_content(requests[-1]) == MERGE_SYSTEM_PROMPT
    for i, body in enumerate(chunks, 1):
        assert user_content(body).startswith(f"Part {i} of {n} of the conversation:\n")
    # every request fits the compactor's window, estimated as the runtime estimates
    assert all(fits_window(body, WINDOW) for body in requests)
    # the chunks are the rendered history, in order, each event's lines together
    bodies = [user_content(b).split("\n", 1)[1] for b in chunks]
    assert "\n".join(bodies) == render_history(history)
    assert not any(b.startswith("[assistant tool call") or b.startswith("  ") for b in bodies)
    # the merge carries every part's summary, tagged, oldest first
    merged = user_content(merges[0]).split("\n")[1:]
    assert merged == [
        f"[summary of part {i} of {n}] summary of Part {i} of {n} of the conversation:" for i in range(1, n + 1)
    ]
    # one usage/recorded per request, with the compactor's spec
    recorded = events(session, "usage/recorded")
    assert len(recorded) == len(requests)
    assert {r["model"] for r in recorded} == {COMPACTOR} and {r["purpose"] for r in recorded} == {"compaction"}
    # the task survives verbatim
    data = Event.objects.get(session=session, seq=result.seq).data
    assert data["summary"].startswith(preamble())
    assert data["summary"] == preamble() + f"summary of Summaries of all {n} parts of the conversation:"
    assert derive_messages(session.id) == [{"role": "user", "content": SUMMARY_PREFIX + data["summary"]}]


def test_summaries_too_long_for_one_merge_are_merged_in_groups(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST)
    for t in range(40):
        add_turn(session, f"turn {t}", tools=2, result_chars=600, tag=f"g{t}")

    def long_summaries(body: dict[str, Any]) -> Reply:
        # Part summaries of ~1,200 characters: about five fill a request.
        return Reply(text=("a long summary " * 80).strip(), usage=(10, 5, None))

    fake_llm.responder = long_summaries
    result = compaction.compact(session.id, manual=True)
    assert result is not None
    requests = fake_llm.requests
    chunks = [r for r in requests if system_content(r) == CHUNK_SYSTEM_PROMPT]
    merges = [r for r in requests if system_content(r) == MERGE_SYSTEM_PROMPT]
    assert len(merges) >= 2 and len(requests) == len(chunks) + len(merges)
    assert user_content(merges[0]).startswith("Summaries of parts 1 to ")
    assert user_content(merges[-1]).startswith("Summaries of all ")
    assert all(fits_window(body, WINDOW) for body in requests)
    assert usage_count(session) == len(requests)


def test_a_history_that_will_not_come_down_fails_within_bounded_rounds(
    fake_llm: Any, session: Session, profile: AgentProfile
) -> None:
    profile.context_windows = {"compactor": 1_100}  # about 2,500 characters a request
    profile.save()
    add_turn(session, FIRST)
    for t in range(150):
        add_turn(session, f"turn {t}", tools=2, result_chars=500, tag=f"h{t}")
    head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
    # every summary as long as a part may be (a quarter of a request): each
    # merge round cuts their number by four, too little for some ninety parts
    # within the bound (map, two rounds of groups, and no room for the last)
    fake_llm.responder = lambda body: Reply(text="x" * MAX_PART_CHARS, usage=(10, 5, None))
    with pytest.raises(SummarizerFailed, match="did not come down to one summary within 4 rounds"):
        compaction.compact(session.id, manual=True)
    assert all(fits_window(body, 1_100) for body in fake_llm.requests)
    # no compaction; every request that was answered is on the books
    assert kinds(session, head) == ["usage/recorded"] * len(fake_llm.requests)


# ---------------------------------------------------------------- oversize parts


def test_oversize_tool_results_are_cut_with_a_marker(fake_llm: Any, session: Session, profile: AgentProfile) -> None:
    profile.context_windows = {}  # no window known: the default budget, one request
    profile.save()
    add_turn(session, FIRST)
    huge = "HEAD-" + "0123456789" * 10_000 + "-TAIL"  # 100,010 characters in one tool result
    log.append_many(
        session.id,
        [
            ("turn/start", {}),
            ("user/message", {"text": "read the big file"}),
            (
                "assistant/message",
                {"content": None, "tool_calls": [{"id": "big", "name": "debug.noop", "arguments": "{}"}]},
            ),
            ("tool/result", {"call_id": "big", "name": "debug.noop", "content": huge}),
            ("assistant/message", {"content": "it is big"}),
            ("turn/end", {"status": "completed"}),
        ],
    )
    fake_llm.script(Reply(text="S"))
    assert compaction.compact(session.id, manual=True) is not None
    (request,) = fake_llm.requests
    assert system_content(request) == SUMMARY_SYSTEM_PROMPT
    (line,) = [x for x in user_content(request).split("\n[") if x.startswith("tool result big ")]
    assert len(line) < MAX_PART_CHARS
    found = re.search(r"\n  \[… (\d+) characters cut for the summary\]\n  ", line)
    assert found is not None
    kept = len(line.split("] ", 1)[1]) - len(found.group(0))  # the head and tail around the marker
    assert int(found.group(1)) == len(huge) - kept
    assert "HEAD-0123" in line and line.endswith("789-TAIL")  # head and tail kept
    assert "[assistant] it is big" in user_content(request)  # what follows is intact


def test_oversize_part_is_cut_to_fit_a_small_window(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST)
    add_turn(session, "print the log", tools=1, result_chars=40_000, tag="big")
    fake_llm.responder = numbered
    assert compaction.compact(session.id, manual=True) is not None
    assert all(fits_window(body, WINDOW) for body in fake_llm.requests)
    sent = "\n".join(user_content(b) for b in fake_llm.requests)
    assert "characters cut for the summary]" in sent and "result 0 of big: lorem" in sent


# ---------------------------------------------------------------- ContextTooLong


def test_compactor_refusing_as_too_long_is_retried_with_a_smaller_budget(
    fake_llm: Any, session: Session, profile: AgentProfile
) -> None:
    profile.context_windows = {"compactor": 20_000}  # believed; the model takes 8,000 characters
    profile.save()
    fake_llm.max_context_chars = 8_000
    add_turn(session, FIRST)
    for t in range(20):
        add_turn(session, f"turn {t}", tools=2, result_chars=500, tag=f"r{t}")
    head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
    fake_llm.responder = numbered

    result = compaction.compact(session.id, manual=True)

    assert result is not None
    assert len(fake_llm.refused) == 1 and fake_llm.refused[0] is fake_llm.requests[0]  # the one-request try
    assert len(fake_llm.accepted) > 2  # then chunks and a merge, each within the model's real limit
    assert all(request_size(body) <= 8_000 for body in fake_llm.accepted)
    # one usage/recorded per answered request (the refused one cost nothing),
    # and the window the provider stated, recorded for the compactor's model
    assert kinds(session, head) == ["session/compacted"] + ["usage/recorded"] * len(fake_llm.accepted) + [
        "model/window"
    ]
    (window,) = events(session, "model/window")
    assert window == {"role": "compactor", "spec": "test/scaling-compactor", "tokens": 8_000 // 4, "source": "error"}
    assert ModelWindow.objects.get(spec="test/scaling-compactor").tokens == 2_000
    assert result.summary.startswith(preamble())


def test_compactor_refusing_again_fails_and_keeps_the_usage(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST)
    for t in range(20):
        add_turn(session, f"turn {t}", tools=2, result_chars=500, tag=f"f{t}")
    head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
    answered = []

    def shrinking(body: dict[str, Any]) -> Reply:
        # Two chunks are answered; then the model's window turns out tiny.
        answered.append(body)
        if len(answered) == 2:
            fake_llm.max_context_chars = 1_500
        return Reply(text="part summary", usage=(100, 10, 0.001))

    fake_llm.responder = shrinking
    with pytest.raises(SummarizerFailed) as failed:
        compaction.compact(session.id, manual=True)
    assert "window" in str(failed.value)
    assert len(fake_llm.refused) >= 1 and len(fake_llm.accepted) == 2
    # nothing but the usage of the two answered requests
    assert kinds(session, head) == ["usage/recorded", "usage/recorded"]
    assert derive_messages(session.id)[0] == {"role": "user", "content": FIRST}


def test_a_compactor_refusing_without_figures_is_tried_with_halved_windows(
    fake_llm: Any, session: Session, profile: AgentProfile, settings: Any
) -> None:
    """Issue 27: a bare `context_length_exceeded` used to get one more try at
    a fixed half of the default window (50,000 tokens), then give up. Now
    each refusal halves the refused request's estimate, until the requests fit."""
    settings.TERRET_CONTEXT_FLOOR_TOKENS = 1_000
    profile.context_windows = {}  # nothing declared: the default window, 100,000 tokens
    profile.save()
    fake_llm.max_context_chars = 8_000
    fake_llm.refusal = "bare"
    add_turn(session, FIRST)
    for t in range(20):
        add_turn(session, f"turn {t}", tools=2, result_chars=500, tag=f"h{t}")
    head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
    fake_llm.responder = numbered

    result = compaction.compact(session.id, manual=True)

    assert result is not None and result.summary.startswith(preamble())
    refused = fake_llm.refused
    assert len(refused) >= 2, "refused at the default window, and again at half the first refusal"
    sizes = [request_size(b) for b in refused]
    assert sizes == sorted(sizes, reverse=True) and sizes[1] <= sizes[0] // 2 + 1_000  # halved, then halved again
    assert all(request_size(b) <= 8_000 for b in fake_llm.accepted) and len(fake_llm.accepted) > 2
    (window,) = events(session, "model/window")
    assert window["source"] == "refusal" and window["role"] == "compactor" and window["spec"] == COMPACTOR
    assert 1_000 <= window["tokens"] <= 8_000 // 3  # within what the model took, in our estimate's units
    assert kinds(session, head).count("usage/recorded") == len(fake_llm.accepted)


def test_a_compactor_refused_at_the_floor_gives_up(fake_llm: Any, session: Session, profile: AgentProfile) -> None:
    profile.context_windows = {}
    profile.save()
    fake_llm.max_context_chars = 2_000  # 500 tokens: under any window above the floor (4,096)
    fake_llm.refusal = "openai-no-figures"
    add_turn(session, FIRST)
    for t in range(20):
        add_turn(session, f"turn {t}", tools=2, result_chars=500, tag=f"g{t}")

    with pytest.raises(SummarizerFailed) as failed:
        compaction.compact(session.id, manual=True)

    assert "no smaller window is left to try above the floor of 4096 tokens" in str(failed.value)
    assert fake_llm.accepted == [] and 2 <= len(fake_llm.refused) <= 6  # halved down to the floor, then no more
    assert events(session, "session/compacted") == []


def test_in_turn_compaction_reports_a_refusal_instead_of_raising(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST)
    fake_llm.max_context_chars = 100  # nothing fits, whatever the budget
    held, turn_seq = open_turn(session, "the current request")
    try:
        head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
        reason = compaction.compact_in_turn(session.id, held.fence, turn_seq)
        assert reason is not None and reason.startswith("the summarizer failed: ")
        assert kinds(session, head) == []
    finally:
        lease.release(held)


# ---------------------------------------------------------------- the task survives


def test_the_task_survives_three_compactions_verbatim_and_once(fake_llm: Any, session: Session) -> None:
    """The compactor echoes what it is given: a preamble that reached it would
    come back and appear twice."""
    fake_llm.responder = lambda body: Reply(text="echo: " + user_content(body), usage=(10, 5, None))
    add_turn(session, FIRST, tag="0")
    for n in range(1, 4):
        add_turn(session, f"follow-up {n}", tag=str(n))
        assert compaction.compact(session.id, manual=True) is not None
    summaries = events(session, "session/compacted")
    assert len(summaries) == 3
    latest = summaries[-1]["summary"]
    assert latest.startswith(preamble())
    assert latest.count(compaction.TASK_HEADING) == 1
    assert all(compaction.TASK_HEADING not in user_content(r) for r in fake_llm.requests)
    # the later compactions summarized the earlier summary (without its preamble)
    assert "[summary of earlier conversation] echo: " in user_content(fake_llm.requests[-1])
    assert derive_messages(session.id)[0]["content"] == SUMMARY_PREFIX + latest


def test_a_long_task_is_cut_in_the_preamble(fake_llm: Any, session: Session) -> None:
    first = "spec line\n" * 1_000  # 10,000 characters
    add_turn(session, first)
    fake_llm.script(Reply(text="S"))
    result = compaction.compact(session.id, manual=True)
    assert result is not None
    kept = first[: compaction.PREAMBLE_MAX_CHARS]
    assert result.summary == (f"{compaction.TASK_HEADING}{kept}\n[… {len(first) - len(kept)} more characters cut]\n\nS")


# ---------------------------------------------------------------- Morph's limit


def _content_chars(body: dict[str, Any]) -> int:
    return sum(len(m["content"]) for m in body["messages"]) + len(body.get("query", ""))


def test_morph_input_fits_its_limit(morph: MorphServer, session: Session, profile: AgentProfile) -> None:
    profile.summarizer = "morph"
    profile.save()
    add_turn(session, FIRST)
    for t in range(20):
        add_turn(session, f"turn {t}", tools=1, result_chars=90_000, tag=f"m{t}")  # 1.8M characters
    add_turn(session, "the last one", tools=1, result_chars=400_000, tag="huge")  # one part over the cap
    morph.payload = {"id": "c", "model": "morph-compactor", "output": "compacted", "usage": {"input_tokens": 7}}

    result = compaction.compact(session.id, manual=True)

    assert result is not None and result.summary == preamble() + "compacted"
    (request,) = morph.requests
    body = request["body"]
    messages = body["messages"]
    assert _content_chars(body) <= MORPH_MAX_INPUT_CHARS
    assert messages[0] == {"role": "user", "content": FIRST}  # the first user message is kept
    left_out = messages[1]["content"]
    assert messages[1]["role"] == "user" and left_out.startswith("[… ")
    assert left_out.endswith(" earlier messages were left out to fit Morph's input limit]")
    assert messages[-1] == {"role": "assistant", "content": "[assistant] done with the last one"}
    (huge,) = [m for m in messages if "result 0 of huge" in m["content"]]
    assert "characters cut for the summary]" in huge["content"]
    assert len(huge["content"]) <= MORPH_MAX_INPUT_CHARS // 10
    assert body["query"] == "the last one"
    assert usage_count(session) == 1


def test_morph_input_within_a_small_limit() -> None:
    events_ = [HistoryEvent(1, "user/message", {"text": "the task"})]
    for n in range(2, 40):
        events_.append(HistoryEvent(n, "assistant/message", {"content": f"{n} " + "w" * 200}))
    body = MorphSummarizer(api_key="k", base_url="http://x", max_input_chars=2_000).request_body(
        History(uuid.uuid4(), 40, events_)
    )
    assert _content_chars(body) <= 2_000
    assert body["messages"][0] == {"role": "user", "content": "the task"}
    dropped = int(body["messages"][1]["content"].split()[1])
    assert len(body["messages"]) == 2 + 38 - dropped
    assert body["messages"][-1]["content"].startswith("[assistant] 39 ")


# ---------------------------------------------------------------- inside a turn


def open_turn(session: Session, text: str, *, ttl: float | None = None) -> tuple[lease.Lease, int]:
    """Claim the session's lease and open a turn under it with one step done
    (a call and its result): a step boundary."""
    held = lease.claim(session.id, ttl=ttl)
    assert held is not None
    fence = held.fence
    start = log.append(session.id, "turn/start", {}, fence=fence)
    call = {"id": "in1", "name": "debug.noop", "arguments": "{}"}
    log.append_many(
        session.id,
        [
            ("user/message", {"text": text}),
            ("step/start", {"step": 1, "model": "test/model"}),
            ("assistant/message", {"content": "checking", "tool_calls": [call]}),
            ("tool/result", {"call_id": "in1", "name": "debug.noop", "content": "noop ok"}),
            ("step/end", {"step": 1, "usage": {"prompt_tokens": 5, "completion_tokens": 1, "cost": None}}),
        ],
        fence=fence,
    )
    return held, start.seq


def in_own_connection(fn: Callable[[], Any]) -> Any:
    """Run DB work from the fake's request thread, and close its connection."""
    try:
        return fn()
    finally:
        connection.close()


def test_compact_in_turn_at_a_step_boundary(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST)
    held, turn_seq = open_turn(session, "now rename the invoices table")
    try:
        head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
        fake_llm.responder = lambda body: Reply(text="echo: " + user_content(body), usage=(10, 5, None))

        assert compaction.compact_in_turn(session.id, held.fence, turn_seq) is None

        assert kinds(session, head) == ["session/compacted", "usage/recorded"]
        data = events(session, "session/compacted")[-1]
        assert data["upto_seq"] == head and data["turn_seq"] == turn_seq
        request_block = compaction.REQUEST_HEADING + "now rename the invoices table\n\n"
        assert data["summary"].startswith(preamble() + request_block + "echo: ")
        # the turn's own messages are in the summary, so the model sees only it
        assert "[tool result in1 debug.noop ok] noop ok" in data["summary"]
        assert derive_messages(session.id) == [{"role": "user", "content": SUMMARY_PREFIX + data["summary"]}]
        assert Session.objects.get(id=session.id).open_turn_seq == turn_seq  # the turn goes on

        # a second compaction in the same turn: each block once
        log.append(session.id, "assistant/message", {"content": "renamed"}, fence=held.fence)
        assert compaction.compact_in_turn(session.id, held.fence, turn_seq) is None
        latest = events(session, "session/compacted")[-1]["summary"]
        assert latest.startswith(preamble() + request_block)
        assert latest.count(compaction.TASK_HEADING) == 1 and latest.count(compaction.REQUEST_HEADING) == 1
        # nothing new since: declined without a model call
        requests = len(fake_llm.requests)
        assert compaction.compact_in_turn(session.id, held.fence, turn_seq) == compaction.NOTHING_NEW
        assert len(fake_llm.requests) == requests
    finally:
        lease.release(held)


def test_compact_in_the_first_turn_gives_the_task_as_the_request_too(fake_llm: Any, session: Session) -> None:
    held, turn_seq = open_turn(session, FIRST)
    try:
        fake_llm.script(Reply(text="S"))
        assert compaction.compact_in_turn(session.id, held.fence, turn_seq) is None
        summary = events(session, "session/compacted")[-1]["summary"]
        assert summary == preamble() + compaction.REQUEST_HEADING + FIRST + "\n\nS"
    finally:
        lease.release(held)


@pytest.mark.parametrize("problem", ["approval", "unknown", "wrong_turn", "closed"])
def test_compact_in_turn_refuses(fake_llm: Any, session: Session, problem: str) -> None:
    add_turn(session, FIRST)
    held, turn_seq = open_turn(session, "do it")
    fence = held.fence
    try:
        if problem == "approval":
            log.append(
                session.id, "approval/requested", {"call_id": "p", "name": "debug.noop", "args": {}}, fence=fence
            )
            expected = "approvals are pending in the open turn"
        elif problem == "unknown":
            attempt = {"call_id": "u", "name": "debug.noop", "attempt": 1, "idempotency_key": "k", "replay": "never"}
            log.append(session.id, "tool/attempt", {**attempt, "fence": held.gen}, fence=fence)
            log.append(session.id, "tool/unknown", {"call_id": "u", "name": "debug.noop", "attempt": 1}, fence=fence)
            expected = "a tool call of the open turn has an unknown outcome"
        elif problem == "wrong_turn":
            turn_seq += 1
            expected = f"the turn begun at {turn_seq} is not the session's open turn"
        else:
            log.append(session.id, "turn/end", {"status": "completed"}, fence=fence)
            expected = f"the turn begun at {turn_seq} is not the session's open turn"
        head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
        assert compaction.compact_in_turn(session.id, fence, turn_seq) == expected
        assert kinds(session, head) == [] and fake_llm.requests == []
    finally:
        lease.release(held)


def test_compact_in_turn_with_a_lost_lease_raises_and_keeps_the_usage(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST)
    held, turn_seq = open_turn(session, "do it", ttl=0.5)
    lease.keeper.drop(held)  # a stalled worker: no renewals
    taken: list[lease.Lease] = []

    def steal(body: dict[str, Any]) -> Reply:
        # While the summary is being written, the lease expires and another worker takes it.
        threading.Event().wait(0.6)
        other = in_own_connection(lambda: lease.claim(session.id))
        assert other is not None
        taken.append(other)
        return Reply(text="late summary", usage=(10, 5, 0.001))

    fake_llm.responder = steal
    head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)
    try:
        with pytest.raises(LeaseLost):
            compaction.compact_in_turn(session.id, held.fence, turn_seq)
        assert kinds(session, head) == ["usage/recorded"]  # no compaction; the spend is on the books
    finally:
        for other in taken:
            lease.release(other)


def test_compact_in_turn_declines_when_a_model_visible_event_arrives(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST)
    held, turn_seq = open_turn(session, "do it")
    head = Session.objects.values_list("last_seq", flat=True).get(id=session.id)

    def interject(body: dict[str, Any]) -> Reply:
        in_own_connection(lambda: log.append(session.id, "context/injected", {"text": "wait, one more thing"}))
        return Reply(text="a summary that misses it", usage=(10, 5, None))

    fake_llm.responder = interject
    try:
        assert compaction.compact_in_turn(session.id, held.fence, turn_seq) == compaction.RACED
        assert kinds(session, head) == ["context/injected", "usage/recorded"]
        assert derive_messages(session.id)[-1] == {"role": "user", "content": "wait, one more thing"}
    finally:
        lease.release(held)


def test_between_turns_compaction_still_declines_while_a_turn_is_open(fake_llm: Any, session: Session) -> None:
    add_turn(session, FIRST)
    held, _ = open_turn(session, "do it")
    try:
        assert compaction.attempt(session.id, manual=True) == compaction.Declined(compaction.TURN_OPEN)
        assert fake_llm.requests == []
    finally:
        lease.release(held)
