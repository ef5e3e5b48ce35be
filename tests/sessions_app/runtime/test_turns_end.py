"""Every turn ends, or is visibly blocked (issue 12).

Driven synchronously (TERRET_WORKER=manual) against the local SSE model
server, so each test counts exactly how many requests a poison turn makes:
the bound is the point. Worker processes run the same code (drive.drive);
test_poison_workers.py checks the same bounds with real workers.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals_app import services as approvals
from sessions_app import log, services
from sessions_app.errors import NotBlocked
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime import dispatch, documents, hooks
from sessions_app.runtime.drive import drive
from sessions_app.runtime.storable import CUT_MARK
from tests.chaos.invariants import Ev, log_problems
from tests.fakes.fake_llm import Reply
from tests.helpers import events, kinds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]

OPEN_STEP = (("turn/start", {}), ("user/message", {"text": "hi"}), ("step/start", {"step": 1, "model": "m"}))


def crash_log(session: Session, *entries: tuple[str, dict[str, Any]]) -> None:
    for kind, data in entries:
        log.append(session.id, kind, data)


def ended(session: Session) -> dict[str, Any]:
    (end,) = events(session, "turn/end")
    return end


def drive_while_streaming(session: Session, fake_llm: Any, streamed: float) -> tuple[threading.Thread, list[str]]:
    """A drive in a thread of its own, returned once its model call has
    streamed for `streamed` seconds; the list receives its outcome."""
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(drive(session.id)))
    worker.start()
    deadline = time.monotonic() + 10
    while not fake_llm.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(streamed)
    return worker, outcome


def drive_until_quiet(session: Session, rounds: int = 20) -> list[str]:
    """Drive like a sweep would, ignoring backoff, until nothing is owed."""
    outcomes = []
    for _ in range(rounds):
        Session.objects.filter(id=session.id).update(lease_expires_at=None)  # the backoff has passed
        outcome = drive(session.id)
        outcomes.append(str(outcome))
        if outcome in ("ended", "blocked", "idle"):
            break
    return outcomes


def test_unknown_builtin_tool_blocks_the_turn_without_a_model_request(
    fake_llm: Any, make_user: Any, settings: Any
) -> None:
    broken = AgentProfile.objects.create(name="broken", roles={"main": "test/model"}, builtin_tools=["no.such"])
    session = services.create_session(make_user(), broken)  # created past the admin's validation
    services.run_turn(session.id, "hi")
    assert drive(session.id) == "blocked"
    (blocked,) = events(session, "turn/blocked")
    assert (blocked["code"], blocked["what"]) == ("definition_missing", "tool:no.such")
    assert fake_llm.requests == [] and events(session, "turn/end") == []
    session.refresh_from_db()
    assert session.status == "blocked"
    # later input rides into the open turn, which blocks the same way, once: no loop, no model request
    services.inject(session.id, "again", wake=True)
    assert drive(session.id) == "blocked"
    assert len(events(session, "turn/blocked")) == 2 and fake_llm.requests == []


def test_a_raising_pre_step_hook_fails_the_turn(fake_llm: Any, session: Session) -> None:
    def explode(ctx: hooks.StepContext) -> str | None:
        raise RuntimeError("hook exploded")

    hooks.register_pre_step(explode)
    try:
        services.run_turn(session.id, "hi")
        assert drive(session.id) == "ended"
    finally:
        hooks.pre_step.remove(explode)
    end = ended(session)
    assert end["status"] == "failed" and "hook exploded" in end["error"]
    assert fake_llm.requests == []


def test_a_tool_result_the_log_refuses_fails_the_turn(fake_llm: Any, session: Session, settings: Any) -> None:
    # Results are cut to fit, so make the cut larger than what the log takes.
    settings.TERRET_MAX_TOOL_RESULT_CHARS = 10_000_000
    settings.TERRET_MAX_EVENT_BYTES = 20_000
    documents.write(session.id, "big.txt", b"x" * 50_000)
    fake_llm.script(Reply(tool_calls=[("workspace.read", {"path": "big.txt"})]), Reply(text="never asked"))
    services.run_turn(session.id, "read it")
    assert drive_until_quiet(session)[-1] == "ended"
    end = ended(session)
    assert end["status"] == "failed" and "larger than 20000 bytes" in end["error"]
    assert len(fake_llm.requests) == 1
    (result,) = events(session, "tool/result")
    assert result["is_error"] and result["content"].startswith("failed: ")


def test_a_400_on_resume_after_a_park_fails_at_once_with_the_providers_message(
    fake_llm: Any, session: Session, make_reviewer: Any
) -> None:
    session.profile.approvals = {"workspace.write": "always"}  # type: ignore[union-attr]
    session.profile.save()  # type: ignore[union-attr]
    fake_llm.script(
        Reply(tool_calls=[("workspace.write", {"path": "a.txt", "content": "v"})]),
        Reply(status=400, error_message="This model does not support the 'tools' parameter"),
    )
    services.run_turn(session.id, "write")
    assert drive(session.id) == "parked"
    (asked,) = events(session, "approval/requested")
    approvals.decide(session.id, asked["call_id"], "approve", user=make_reviewer("rev"))
    assert drive_until_quiet(session)[-1] == "ended"
    end = ended(session)
    assert end["status"] == "failed"
    assert "does not support the 'tools' parameter" in end["error"] and "HTTP 400" in end["error"]
    assert len(fake_llm.requests) == 2  # no retry of a permanent failure
    assert "turn/stalled" not in kinds(session)


def test_a_model_answering_500_forever_blocks_a_resumed_turn_after_bounded_requests(
    fake_llm: Any, session: Session, settings: Any
) -> None:
    settings.TERRET_LLM_RETRIES = 1
    settings.TERRET_LLM_BACKOFF_BASE = 0
    settings.TERRET_RESUME_ATTEMPTS = 3
    fake_llm.responder = lambda body: Reply(status=500)
    crash_log(session, *OPEN_STEP)
    outcomes = drive_until_quiet(session)
    assert outcomes == ["resume_failed", "resume_failed", "blocked"]
    assert len(fake_llm.requests) == 3 * 2  # attempts x (1 + retries), and then no more
    assert [e["attempt"] for e in events(session, "turn/stalled")] == [1, 2]
    assert [e["retry_in"] for e in events(session, "turn/stalled")] == [
        settings.TERRET_RESUME_BACKOFF_SECONDS,
        settings.TERRET_RESUME_BACKOFF_SECONDS * 2,
    ]
    (blocked,) = events(session, "turn/blocked")
    assert blocked["attempts"] == 3 and "HTTP 500" in blocked["reason"]
    session.refresh_from_db()
    assert session.status == "blocked"
    # a stray wake-up does nothing
    assert drive(session.id) == "blocked"
    assert len(fake_llm.requests) == 6
    # an operator's retry gives it one more attempt, then it is blocked again
    services.retry(session.id, by="ops")
    assert drive(session.id) == "blocked"
    assert len(fake_llm.requests) == 8
    assert len(events(session, "turn/blocked")) == 2
    # once the provider is back, new input picks the turn up
    fake_llm.responder = lambda body: Reply(text="back")
    services.inject(session.id, "still there?", wake=True)
    assert drive(session.id) == "ended"
    assert ended(session)["status"] == "completed"
    with pytest.raises(NotBlocked):
        services.retry(session.id)


def test_a_fresh_turn_fails_on_a_transient_error_without_blocking(
    fake_llm: Any, session: Session, settings: Any
) -> None:
    settings.TERRET_LLM_RETRIES = 1
    settings.TERRET_LLM_BACKOFF_BASE = 0
    fake_llm.responder = lambda body: Reply(status=503, error_message="upstream overloaded")
    services.run_turn(session.id, "hi")
    assert drive(session.id) == "ended"
    end = ended(session)
    assert end["status"] == "failed" and "upstream overloaded" in end["error"]
    assert len(fake_llm.requests) == 2


def test_redrive_after_a_park_is_not_a_resume(
    fake_llm: Any, session: Session, settings: Any, make_reviewer: Any
) -> None:
    """A transient failure right after a verdict fails the turn (it is no
    crash re-entry), rather than looping through the resume backoff."""
    settings.TERRET_LLM_RETRIES = 0
    session.profile.approvals = {"workspace.write": "always"}  # type: ignore[union-attr]
    session.profile.save()  # type: ignore[union-attr]
    fake_llm.script(Reply(tool_calls=[("workspace.write", {"path": "a.txt", "content": "v"})]), Reply(status=502))
    services.run_turn(session.id, "write")
    assert drive(session.id) == "parked"
    (asked,) = events(session, "approval/requested")
    approvals.decide(session.id, asked["call_id"], "approve", user=make_reviewer("rev"))
    assert drive(session.id) == "ended"
    assert ended(session)["status"] == "failed"


def test_nul_and_oversize_model_output_are_stored_not_fatal(fake_llm: Any, session: Session, settings: Any) -> None:
    settings.TERRET_MAX_MODEL_TEXT_CHARS = 5_000
    settings.TERRET_MAX_TOOL_RESULT_CHARS = 3_000
    fake_llm.script(
        Reply(text="nul:\x00:end"),
    )
    services.run_turn(session.id, "hi")
    assert drive(session.id) == "ended"
    assert events(session, "assistant/message")[0]["content"] == "nul:\\u0000:end"
    assert ended(session)["status"] == "completed"

    fake_llm.script(
        Reply(tool_calls=[("workspace.write", {"path": "n.txt", "content": "a\x00b" * 2000})]),
        Reply(tool_calls=[("workspace.read", {"path": "n.txt"})]),
        Reply(text="y" * 12_000),
    )
    session.profile.approvals = {"workspace.write": "never"}  # type: ignore[union-attr]
    session.profile.save()  # type: ignore[union-attr]
    services.run_turn(session.id, "again")
    assert drive(session.id) == "ended"
    assert [e["status"] for e in events(session, "turn/end")] == ["completed", "completed"]
    *_, read = events(session, "tool/result")
    assert len(read["content"]) <= 3_000 and "cut by Terret" in read["content"] and "\x00" not in read["content"]
    final = events(session, "assistant/message")[-1]["content"]
    assert len(final) <= 5_000 and final.endswith(CUT_MARK.format(n=12_000 - (5_000 - len(CUT_MARK.format(n=12_000)))))


def test_a_lone_surrogate_in_model_output_is_stored_as_a_replacement_character(fake_llm: Any, session: Session) -> None:
    # The provider's JSON may carry a lone \\ud800 escape; UTF-8 cannot encode it, and the log refuses it.
    fake_llm.script(Reply(text="half:\ud800:end"))
    services.run_turn(session.id, "hi")
    assert drive(session.id) == "ended"
    assert events(session, "assistant/message")[0]["content"] == "half:\ufffd:end"
    assert ended(session)["status"] == "completed"


def test_a_ten_megabyte_answer_is_cut_and_the_next_request_carries_the_cut(
    fake_llm: Any, session: Session, settings: Any
) -> None:
    fake_llm.script(Reply(text="z" * 10_000_000), Reply(text="short"))
    services.run_turn(session.id, "flood")
    assert drive(session.id) == "ended"
    kept = events(session, "assistant/message")[0]["content"]
    assert len(kept) <= settings.TERRET_MAX_MODEL_TEXT_CHARS and "cut by Terret" in kept
    services.run_turn(session.id, "next")
    drive(session.id)
    sent = fake_llm.requests[1]["messages"]
    assert max(len(str(m.get("content") or "")) for m in sent) <= settings.TERRET_MAX_MODEL_TEXT_CHARS


def test_cancel_mid_stream_stops_within_a_second_and_keeps_the_partial_text(
    fake_llm: Any, session: Session, settings: Any
) -> None:
    settings.TERRET_CANCEL_POLL_SECONDS = 0.1
    fake_llm.script(Reply(text="word " * 400, chunk_delay=0.05))  # about 20 s of streaming
    services.run_turn(session.id, "talk")
    worker, outcome = drive_while_streaming(session, fake_llm, streamed=1.0)
    cancelled_at = time.monotonic()
    assert services.cancel(session.id, by="owner")
    worker.join(5)
    assert outcome == ["ended"]
    assert time.monotonic() - cancelled_at < 1.5
    message = events(session, "assistant/message")[-1]
    assert message["partial"] is True and message["content"].startswith("word ") and message["tool_calls"] == []
    assert len(message["content"]) < len("word " * 400)
    assert ended(session)["status"] == "cancelled"
    assert kinds(session)[-3:] == ["assistant/message", "step/end", "turn/end"]


def test_cancel_of_a_turn_no_worker_holds_closes_it_at_once(fake_llm: Any, session: Session) -> None:
    crash_log(session, *OPEN_STEP)  # admitted, never claimed
    assert services.cancel(session.id, by="alice")
    end = ended(session)
    assert end == {"status": "cancelled", "by": "alice"}
    assert kinds(session)[-3:] == ["turn/cancel_requested", "step/end", "turn/end"]
    session.refresh_from_db()
    assert session.status == "idle" and session.cancel_seq is None
    assert drive(session.id) == "idle"
    assert fake_llm.requests == []


def test_a_cancel_after_the_lease_lapsed_ends_the_turn_once_and_fences_out_its_holder(
    fake_llm: Any, session: Session, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder's keeper fell behind (its lease lapsed) while it streams.
    Stop closes the turn itself, as for a turn no worker holds, and the
    holder appends nothing more: without the fence-out it streamed on and
    appended a second step/end and turn/end (seen under load in CI). Its
    stop watch sees the lease move on and stops the stream within a poll."""
    settings.TERRET_CANCEL_POLL_SECONDS = 0.1
    fake_llm.script(Reply(text="word " * 80, chunk_delay=0.05))  # about 4 s of streaming
    services.run_turn(session.id, "talk")
    worker, outcome = drive_while_streaming(session, fake_llm, streamed=0.5)
    Session.objects.filter(id=session.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    woken: list[Any] = []
    monkeypatch.setattr(dispatch, "wake", woken.append)  # manual worker: record the wake-up instead
    cancelled_at = time.monotonic()
    assert services.cancel(session.id, by="owner")
    assert woken == [session.id]  # another driver, for what the fenced-out holder would have driven next
    worker.join(10)
    assert outcome == ["lost"]
    assert time.monotonic() - cancelled_at < 1.5  # not the rest of the stream
    assert kinds(session)[-3:] == ["turn/cancel_requested", "step/end", "turn/end"]
    assert ended(session) == {"status": "cancelled", "by": "owner"}
    rows = Event.objects.filter(session=session).order_by("seq").values_list("seq", "kind", "data", "created_at")
    assert log_problems([Ev(seq, kind, data, at.timestamp()) for seq, kind, data, at in rows]) == []
    session.refresh_from_db()
    assert session.status == "idle" and session.lease_owner == ""


def test_cancel_of_a_blocked_turn_closes_it_and_owed_calls_get_results(fake_llm: Any, session: Session) -> None:
    call = {"id": "c9", "name": "debug.noop", "arguments": "{}"}
    crash_log(
        session,
        *OPEN_STEP,
        ("assistant/message", {"content": None, "tool_calls": [call]}),
        ("turn/blocked", {"reason": "model call failed: HTTP 500", "attempts": 5}),
    )
    session.refresh_from_db()
    assert session.status == "blocked"
    assert services.cancel(session.id)
    results = events(session, "tool/result")
    assert results == [
        {"call_id": "c9", "name": "debug.noop", "content": "cancelled: the turn was cancelled", "is_error": True}
    ]
    assert ended(session)["status"] == "cancelled"


@pytest.mark.parametrize(
    "reply",
    [Reply(keepalive_forever=True), Reply(text="partial answer ", hang=True)],
    ids=["keep-alive comments forever", "a silent hang"],
)
def test_a_stream_that_never_finishes_ends_at_its_deadline(
    fake_llm: Any, session: Session, settings: Any, reply: Reply
) -> None:
    settings.TERRET_LLM_DEADLINE_SECONDS = 1.5
    settings.TERRET_LLM_TIMEOUT = 60  # the per-read timeout alone would wait far longer
    fake_llm.script(reply)
    services.run_turn(session.id, "talk")
    started = time.monotonic()
    assert drive(session.id) == "ended"
    assert time.monotonic() - started < 3.0
    end = ended(session)
    assert end["status"] == "failed" and "deadline" in end["error"]
    assert len(fake_llm.requests) == 1  # a deadline is not retried


@pytest.mark.parametrize(
    "reply",
    [
        Reply(keepalive_forever=True),
        Reply(text="partial answer ", hang=True),
        Reply(text="z" * 10_000_000, chunk_delay=0.01),
    ],
    ids=["keep-alive comments forever", "a silent hang", "a 10 MB answer streaming"],
)
def test_cancel_stops_every_kind_of_stuck_stream_within_a_second(
    fake_llm: Any, session: Session, settings: Any, reply: Reply
) -> None:
    settings.TERRET_CANCEL_POLL_SECONDS = 0.2
    fake_llm.script(reply)
    services.run_turn(session.id, "talk")
    worker, outcome = drive_while_streaming(session, fake_llm, streamed=0.5)
    cancelled_at = time.monotonic()
    services.cancel(session.id)
    worker.join(5)
    assert outcome == ["ended"] and time.monotonic() - cancelled_at < 1.0
    assert ended(session)["status"] == "cancelled"
    message = events(session, "assistant/message")[-1]
    assert message["partial"] is True
