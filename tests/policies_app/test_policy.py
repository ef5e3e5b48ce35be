"""The allow-list: what is in force, the read-through cache, updates, and the
veto inside the real turn loop."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, Permission

from policies_app import allowlist, services
from policies_app.selectors import ActivePolicy, cache, current_patterns, current_policy, history
from sessions_app import log
from sessions_app import services as sessions
from sessions_app.errors import InvalidPattern, NotAllowed, UnknownSession
from sessions_app.log import fanout
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime import hooks
from sessions_app.runtime.drive import drive
from sessions_app.tools.builtins import BUILTINS
from tests.fakes.fake_llm import Reply

pytestmark = pytest.mark.django_db


def ctx(session: Session, profile: AgentProfile, tool: str) -> hooks.CallContext:
    return hooks.CallContext(session.id, profile, BUILTINS[tool], {})


def count(session: Session) -> int:
    return Event.objects.filter(session=session).count()


def test_the_veto_is_registered() -> None:
    assert allowlist.veto in hooks.pre_execute


def test_floor_applies_until_the_session_sets_a_policy(session: Session, profile: AgentProfile) -> None:
    assert current_policy(session.id, profile) == ActivePolicy(("clock.*",), "floor")
    assert allowlist.veto(ctx(session, profile, "clock.now")) is None
    reason = allowlist.veto(ctx(session, profile, "debug.noop"))
    assert reason == "debug.noop is not allowed by the agent profile's allow-list floor"
    # Without the turn's profile, the session's is read.
    assert current_patterns(session.id) == ["clock.*"]


def test_session_policy_replaces_the_floor(session: Session, profile: AgentProfile) -> None:
    event = services.update_policy(session.id, ["debug.*"], user=session.owner)
    assert event.data == {"patterns": ["debug.*"], "by": "owner"}
    assert current_policy(session.id, profile) == ActivePolicy(("debug.*",), "session", event.seq)
    assert allowlist.veto(ctx(session, profile, "debug.noop")) is None
    assert "session's allow-list" in (allowlist.veto(ctx(session, profile, "clock.now")) or "")


def test_deny_by_default(session: Session, profile: AgentProfile) -> None:
    profile.allow_floor = []
    assert allowlist.veto(ctx(session, profile, "clock.now")) is not None
    services.update_policy(session.id, [], user=session.owner)  # an explicit empty policy denies all too
    profile.allow_floor = ["*"]
    assert allowlist.veto(ctx(session, profile, "clock.now")) is not None


def test_unknown_session_fails_closed_and_is_never_cached(
    profile: AgentProfile, caplog: pytest.LogCaptureFixture
) -> None:
    ghost = Session(id=uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="policies_app.selectors"):
        reason = allowlist.veto(ctx(ghost, profile, "clock.now"))
    assert reason is not None and "could not be read" in reason
    assert any("unknown session" in r.getMessage() for r in caplog.records)
    assert current_patterns(ghost.id) is None
    assert cache._entries == {}


def test_dangling_policy_seq_fails_closed(session: Session, profile: AgentProfile) -> None:
    # policy_seq names an event that is not a policy/updated: the log and the
    # projection disagree, so nothing is trusted.
    Session.objects.filter(id=session.id).update(policy_seq=1)
    assert current_policy(session.id, profile).source == "closed"
    assert allowlist.veto(ctx(session, profile, "clock.now")) is not None
    assert cache._entries == {}


def test_invalid_patterns_in_the_log_allow_nothing(session: Session, profile: AgentProfile) -> None:
    # Appended behind the service's back (e.g. by an older version).
    log.append(session.id, "policy/updated", {"patterns": ["clock now", "debug.*"]})
    assert current_policy(session.id, profile).patterns == ("debug.*",)


def test_cache_is_validated_against_policy_seq(
    session: Session, profile: AgentProfile, django_assert_num_queries: Any
) -> None:
    services.update_policy(session.id, ["clock.*"], user=session.owner)
    current_policy(session.id, profile)
    with django_assert_num_queries(1):  # the Session row only: the patterns come from the cache
        assert current_policy(session.id, profile).patterns == ("clock.*",)
    # Another process appends (its listener runs there, not here): simulate by
    # appending with this process's listeners switched off.
    before = list(fanout._listeners)
    fanout._listeners[:] = []
    try:
        log.append(session.id, "policy/updated", {"patterns": ["debug.*"], "by": "elsewhere"})
    finally:
        fanout._listeners[:] = before
    with django_assert_num_queries(2):  # policy_seq moved: the stale entry is not used
        assert current_policy(session.id, profile).patterns == ("debug.*",)


@pytest.mark.django_db(transaction=True)
def test_listener_populates_cache_after_commit(session: Session) -> None:
    event = services.update_policy(session.id, ["debug.*"], user=session.owner)
    cached = cache.get(session.id, event.seq)
    assert cached is not None and cached.patterns == ("debug.*",)


def test_update_refuses_bad_patterns_and_appends_nothing(session: Session) -> None:
    before = count(session)
    with pytest.raises(InvalidPattern, match="pattern 2"):
        services.update_policy(session.id, ["clock.*", "rm -rf"], user=session.owner)
    with pytest.raises(InvalidPattern):
        services.update_policy(session.id, "clock.*", user=session.owner)
    assert count(session) == before


def test_who_may_update(session: Session, make_user: Any, django_user_model: Any) -> None:
    reviewer = make_user("rev")
    reviewer.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    before = count(session)
    for user in [AnonymousUser(), make_user("other"), reviewer, make_user("inactive", is_staff=True, is_active=False)]:
        with pytest.raises(NotAllowed):
            services.update_policy(session.id, ["*"], user=user)
    assert count(session) == before
    staff = make_user("staff", is_staff=True)
    assert services.update_policy(session.id, ["*"], user=staff).data["by"] == "staff"
    with pytest.raises(UnknownSession):
        services.update_policy(uuid.uuid4(), ["*"], user=staff)


def test_history_newest_first(session: Session) -> None:
    services.update_policy(session.id, ["a.*"], user=session.owner)
    services.update_policy(session.id, ["b.*", "c"], user=session.owner)
    changes = history(session.id)
    assert [c.patterns for c in changes] == [["b.*", "c"], ["a.*"]]
    assert changes[0].by == "owner" and changes[0].seq > changes[1].seq
    assert len(history(session.id, limit=1)) == 1


@pytest.mark.django_db(transaction=True)
def test_veto_is_an_error_result_and_the_turn_goes_on(fake_llm: Any, session: Session, manual_worker: None) -> None:
    fake_llm.script(Reply(tool_calls=[("debug.noop", {}), ("clock.now", {})]), Reply(text="done"))
    sessions.run_turn(session.id, "go")
    assert drive(session.id) == "ended"
    results = list(
        Event.objects.filter(session=session, kind="tool/result").order_by("seq").values_list("data", flat=True)
    )
    assert [(r["name"], r["is_error"]) for r in results] == [("debug.noop", True), ("clock.now", False)]
    assert results[0]["content"].startswith("vetoed: debug.noop is not allowed")
    end = Event.objects.get(session=session, kind="turn/end")
    assert end.data == {"status": "completed"}


@pytest.mark.django_db(transaction=True)
def test_update_is_in_force_at_the_very_next_tool_call(fake_llm: Any, session: Session, manual_worker: None) -> None:
    """Step 1's call runs under the floor; a policy/updated appended while the
    step 2 model call is in flight vetoes step 2's call."""
    import threading

    release = threading.Event()
    fake_llm.script(
        Reply(tool_calls=[("clock.now", {})]),
        Reply(text="again", tool_calls=[("clock.now", {})], hang=release),
        Reply(text="done"),
    )
    sessions.run_turn(session.id, "go")
    worker = threading.Thread(target=drive, args=(session.id,))
    worker.start()
    try:
        for _ in range(500):
            if len(fake_llm.requests) >= 2:
                break
            threading.Event().wait(0.02)
        services.update_policy(session.id, ["debug.*"], user=session.owner)
    finally:
        release.set()
        worker.join(30)
    results = list(
        Event.objects.filter(session=session, kind="tool/result").order_by("seq").values_list("data", flat=True)
    )
    assert [r["is_error"] for r in results] == [False, True]
    assert "session's allow-list" in results[1]["content"]


@pytest.mark.django_db(transaction=True)
def test_update_between_two_calls_of_one_step_vetoes_the_second(
    fake_llm: Any, make_user: Any, manual_worker: None
) -> None:
    """The runner learns the policy head from its own commits. The update
    lands while the first call (debug.sleep) runs; the second (clock.now) is
    local, so it is decided on the head of the commit made before the first
    ran, and the commit of its result, guarded on that head, writes nothing.
    The runner reads the update (a gap in the seqs) and judges the call
    again. No read of the session row is needed."""
    profile = AgentProfile.objects.create(
        name="two-calls", roles={"main": "test/model"}, builtin_tools=["debug.sleep", "clock.now"], allow_floor=["*"]
    )
    session = sessions.create_session(make_user("two"), profile)
    fake_llm.script(Reply(tool_calls=[("debug.sleep", {"seconds": 1.0}), ("clock.now", {})]), Reply(text="done"))
    # The assistant message is committed once the first call starts running.
    _drive_and_update_policy_once(session, ["debug.*"], "assistant/message")
    results = list(
        Event.objects.filter(session=session, kind="tool/result").order_by("seq").values_list("data", flat=True)
    )
    assert [(r["name"], r["is_error"]) for r in results] == [("debug.sleep", False), ("clock.now", True)]
    assert "session's allow-list" in results[1]["content"]


@pytest.mark.django_db(transaction=True)
def test_update_between_the_claim_and_the_turns_opening_is_in_force(
    fake_llm: Any, make_user: Any, manual_worker: None
) -> None:
    """A worker claims an idle session with queued wake input, a policy update
    commits, then the worker opens the turn. The update precedes the turn (so
    the turn's load never reads it) yet must veto the turn's first call."""
    from sessions_app.runtime import lease
    from sessions_app.runtime.drive import _drive_with_lease

    profile = AgentProfile.objects.create(
        name="late-policy", roles={"main": "test/model"}, builtin_tools=["debug.sleep"], allow_floor=["*"]
    )
    session = sessions.create_session(make_user("late"), profile)
    log.append(session.id, "input/queued", {"text": "go", "wake": True})
    held = lease.claim(session.id)
    assert held is not None and held.driving.policy_seq is None
    try:
        services.update_policy(session.id, ["clock.*"], user=session.owner)
        fake_llm.script(Reply(tool_calls=[("debug.sleep", {"seconds": 0})]), Reply(text="done"))
        outcome, _ = _drive_with_lease(session.id, held)
    finally:
        lease.release(held)
    assert outcome == "ended"
    (result,) = Event.objects.filter(session=session, kind="tool/result").values_list("data", flat=True)
    assert result["is_error"] and "session's allow-list" in result["content"]


def _drive_and_update_policy_once(session: Session, patterns: list[str], once: str) -> None:
    """Drive one turn in a thread; as soon as it has committed an event of
    kind `once`, commit a policy update."""
    import threading

    sessions.run_turn(session.id, "go")
    worker = threading.Thread(target=drive, args=(session.id,))
    worker.start()
    try:
        for _ in range(500):
            if Event.objects.filter(session=session, kind=once).exists():
                break
            threading.Event().wait(0.01)
        services.update_policy(session.id, patterns, user=session.owner)
    finally:
        worker.join(30)
    assert not worker.is_alive()


def _seq_of(session: Session, kind: str) -> int:
    return Event.objects.filter(session=session, kind=kind).order_by("seq").values_list("seq", flat=True)[0]


@pytest.mark.django_db(transaction=True)
def test_update_during_the_model_call_rejudges_the_steps_local_calls(
    fake_llm: Any, make_user: Any, manual_worker: None
) -> None:
    """Local calls are decided on the policy head of the runner's last commit
    (no read) and their results are committed under a guard on that head. An
    update that lands in between makes that commit write nothing; the calls
    are judged again under the update, which then precedes them in the log."""
    profile = AgentProfile.objects.create(
        name="local-calls", roles={"main": "test/model"}, builtin_tools=["clock.now", "debug.noop"], allow_floor=["*"]
    )
    session = sessions.create_session(make_user("local"), profile)
    fake_llm.script(Reply(tool_calls=[("clock.now", {}), ("debug.noop", {})], latency=0.5), Reply(text="done"))
    # step/start is committed right before the model call, which takes 0.5 s.
    _drive_and_update_policy_once(session, ["debug.*"], "step/start")
    rows = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", "kind", "data"))
    kinds = [k for _, k, _ in rows]
    assert kinds.count("assistant/message") == 2 and kinds[-1] == "turn/end"
    assert rows[-1][2] == {"status": "completed"}
    policy_at = next(seq for seq, k, _ in rows if k == "policy/updated")
    message_at = next(seq for seq, k, _ in rows if k == "assistant/message")
    assert policy_at < message_at
    results = [d for _, k, d in rows if k == "tool/result"]
    assert [(r["name"], r["is_error"]) for r in results] == [("clock.now", True), ("debug.noop", False)]
    assert "session's allow-list" in results[0]["content"]
    seqs = [seq for seq, _, _ in rows]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.django_db(transaction=True)
def test_update_during_the_model_call_can_allow_a_local_call_the_old_policy_vetoed(
    fake_llm: Any, make_user: Any, manual_worker: None
) -> None:
    profile = AgentProfile.objects.create(
        name="local-allow", roles={"main": "test/model"}, builtin_tools=["clock.now"], allow_floor=["debug.*"]
    )
    session = sessions.create_session(make_user("allow"), profile)
    fake_llm.script(Reply(tool_calls=[("clock.now", {})], latency=0.5), Reply(text="done"))
    _drive_and_update_policy_once(session, ["clock.*"], "step/start")
    assert _seq_of(session, "policy/updated") < _seq_of(session, "assistant/message")
    (result,) = Event.objects.filter(session=session, kind="tool/result").values_list("data", flat=True)
    assert result["is_error"] is False and result["content"].startswith("20")


@pytest.mark.django_db(transaction=True)
def test_a_step_of_local_calls_reads_no_policy(fake_llm: Any, make_user: Any, manual_worker: None) -> None:
    """Without an update, a step of local calls costs its one batched commit
    and nothing else: no statement reads the session's policy head."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sessions_app.runtime.drive import _drive

    profile = AgentProfile.objects.create(
        name="no-read", roles={"main": "test/model"}, builtin_tools=["clock.now", "debug.noop"], allow_floor=["*"]
    )
    session = sessions.create_session(make_user("noread"), profile)
    sessions.spawn_agent(session, profile)  # a live agent: the first drive spawns none
    services.update_policy(session.id, ["debug.*"], user=session.owner)
    fake_llm.script(Reply(tool_calls=[("debug.noop", {})]), Reply(tool_calls=[("clock.now", {})]), Reply(text="done"))
    sessions.run_turn(session.id, "go")
    with CaptureQueriesContext(connection) as queries:
        outcome, _ = _drive(session.id)
    assert outcome == "ended"
    results = list(Event.objects.filter(session=session, kind="tool/result").values_list("data", flat=True))
    assert [r["is_error"] for r in results] == [False, True]  # the session's policy was applied
    statements = [q["sql"] for q in queries.captured_queries]
    assert not [s for s in statements if "policy_seq" in s and s.lstrip().upper().startswith("SELECT")]
    # The model's learned context window is read once per process per minute
    # (runtime/windows.py) and the operators' suspensions once per second
    # (runtime/limits.py): here on the first step, never per step.
    window_reads = [s for s in statements if "sessions_app_modelwindow" in s]
    suspension_reads = [s for s in statements if "sessions_app_suspension" in s]
    assert len(window_reads) == 1, window_reads
    assert len(suspension_reads) == 1, suspension_reads
    if connection.vendor == "postgresql":
        # The claim (which reads the turn too), the first step/start, one
        # commit per step (each with the next step/start; the last with
        # turn/end and the lease's release).
        # Every profile has a daily budget by default (TERRET_PROFILE_DAILY_*),
        # so each step reads the profile's day once (runtime/limits.py).
        day_reads = [s for s in statements if s.lstrip().startswith("SELECT") and "sessions_app_usageday" in s]
        assert len(day_reads) == 3, day_reads
        rest = [s for s in statements if s not in window_reads + suspension_reads + day_reads]
        assert len(rest) == 1 + 1 + 3, rest
