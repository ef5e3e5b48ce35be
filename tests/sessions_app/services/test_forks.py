"""Forks (services/forks.py): the copied projection, the fork points, the
inheritance by policy (allow-list, model roles, workspace files), what is
never inherited, permissions, a fork of a fork, edit-and-resend and
regenerate. Turns run through the real loop against FakeLLM (a local HTTP
server), driven synchronously (TERRET_WORKER=manual); the fork during a
running turn uses a real Celery worker."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from approvals_app import services as approval_services
from policies_app import services as policy_services
from policies_app.selectors import current_policy
from sessions_app import services
from sessions_app.errors import InvalidForkPoint, InvalidInput, NotAllowed, SessionRevoked, UnknownSession
from sessions_app.llm.openai import to_wire
from sessions_app.log.projection import derive_messages
from sessions_app.models import AgentProfile, Document, Event, Session
from sessions_app.runtime import documents
from sessions_app.runtime.drive import drive
from sessions_app.services import compaction, forks, operators
from sessions_app.tools.builtins import workspace_dir
from tests.fakes.fake_llm import Reply
from tests.helpers import kinds, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

FLOOR = ["*"]


@pytest.fixture
def profile() -> AgentProfile:
    return AgentProfile.objects.create(
        name="fk",
        roles={"main": "test/model", "compactor": "test/compactor"},
        builtin_tools=["workspace.write", "workspace.read", "clock.now", "debug.noop", "debug.charge"],
        allow_floor=FLOOR,
        approvals={"workspace.write": "never"},
    )


def head(session: Session) -> int:
    return int(Session.objects.values_list("last_seq", flat=True).get(id=session.id))


def latest(session: Session, kind: str, before: int | None = None) -> Event:
    """The session's newest event of `kind` (before a seq, if given)."""
    qs = Event.objects.filter(session=session, kind=kind)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    found = qs.order_by("-seq").first()
    assert found is not None, kind
    return found


def files(session_id: Any) -> dict[str, str]:
    """The session's workspace (its documents): path -> text."""
    return {i.name: documents.read(session_id, i.name).data.decode() for i in documents.listing(session_id)}


def on_the_wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the provider receives them (tool names in wire form)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {
                **m,
                "tool_calls": [
                    {**c, "function": {**c["function"], "name": to_wire(c["function"]["name"])}} for c in calls
                ],
            }
        out.append(m)
    return out


def write(path: str, content: str) -> Reply:
    return Reply(tool_calls=[("workspace.write", {"path": path, "content": content})])


def turn(fake: Any, session: Session, text: str, *replies: Reply) -> None:
    fake.script(*replies)
    services.run_turn(session.id, text)
    assert drive(session.id) == "ended"


@dataclass
class State:
    """What was in force at a seq of the parent, as the test made it."""

    patterns: list[str]
    main: str
    files: dict[str, str]


@dataclass
class History:
    parent: Session
    points: dict[str, int] = field(default_factory=dict)
    states: dict[str, State] = field(default_factory=dict)


def mark(h: History, name: str, seq: int, patterns: list[str], main: str) -> None:
    h.points[name] = seq
    h.states[name] = State(list(patterns), main, files(h.parent.id))


@pytest.fixture
def history(fake_llm: Any, session: Session, manual_worker: None, owner: Any) -> History:
    """A parent with tool-calling turns, policy and model changes, a
    compaction between turns, and later changes after every fork point."""
    h = History(session)
    mark(h, "first", 1, FLOOR, "")
    turn(fake_llm, session, "write a", write("a.txt", "one"), Reply(text="wrote a"))
    mark(h, "mid", head(session), FLOOR, "")
    policy_services.update_policy(session.id, ["workspace.*", "clock.now"], user=owner)
    services.set_model(session.id, "main", "test/m2", by="owner")
    pol = ["workspace.*", "clock.now"]
    fake_llm.script(
        Reply(tool_calls=[("workspace.write", {"path": "b.txt", "content": "two"}), ("clock.now", {})]),
        write("a.txt", "one-v2"),
        Reply(text="wrote b"),
    )
    services.run_turn(session.id, "write b")
    assert drive(session.id) == "ended"
    ends = list(
        Event.objects.filter(session=session, kind="step/end", seq__gt=h.points["mid"]).values_list("seq", flat=True)
    )
    # after step 1 of the tool-calling turn: b.txt written, a.txt not yet rewritten
    h.points["step"] = ends[0]
    h.states["step"] = State(pol, "test/m2", {"a.txt": "one", "b.txt": "two"})
    fake_llm.script(Reply(text="The user had a.txt and b.txt written.", usage=(30, 8, 0.001)))
    result = compaction.compact(session.id, manual=True)
    assert result is not None
    mark(h, "compacted", result.seq, pol, "test/m2")
    turn(fake_llm, session, "after compaction", Reply(text="still here"))
    policy_services.update_policy(session.id, ["clock.now"], user=owner)
    services.set_model(session.id, "main", "test/m3", by="owner")
    turn(fake_llm, session, "write c", write("c.txt", "three"), Reply(text="wrote c"))
    mark(h, "head", head(session), ["clock.now"], "test/m3")
    return h


def assert_inherited(h: History, child: Session, name: str, policy: str) -> None:
    parent, point = h.parent, h.points[name]
    state = h.states[name]
    now = h.states["head"]
    where = f"{policy} fork at {name} (seq {point})"
    assert derive_messages(child.id) == derive_messages(parent.id, until_seq=point), where
    expect = {"historical": state, "current": now, "fresh": State(FLOOR, "", {})}[policy]
    assert list(current_policy(child.id).patterns) == expect.patterns, where
    assert child.model_main == expect.main, where
    assert files(child.id) == expect.files, where
    # never inherited: effects, spend, budgets, approvals; the fork is idle and mine
    assert child.status == "idle" and child.open_turn_seq is None, where
    assert (child.steps, child.turns, child.prompt_tokens, child.unpriced_entries) == (0, 0, 0, 0), where
    assert child.cost == 0 and child.budget_cost_usd is None and child.budget_turns is None, where
    assert child.pending_approvals == 0, where
    assert not Event.objects.filter(session=child, kind__in=["tool/attempt", "approval/requested"]).exists(), where
    first = Event.objects.get(session=child, seq=1)
    assert first.kind == "session/forked", where
    assert first.data["parent"] == str(parent.id) and first.data["at_seq"] == point, where
    assert first.data["policy"] == policy and first.data["seed_upto"] == child.last_seq, where


@pytest.mark.parametrize("policy", ["historical", "current", "fresh"])
def test_fork_at_each_point(history: History, owner: Any, policy: str) -> None:
    parent = history.parent
    for name in ("first", "mid", "compacted", "step", "head"):
        before = head(parent)
        child = forks.fork(parent.id, history.points[name], policy, user=owner)
        assert child.owner_id == owner.pk and child.profile_id == parent.profile_id
        assert_inherited(history, child, name, policy)
        # the parent gets one metadata event, and nothing else changes
        assert kinds(parent, before) == ["session/forked_to"]
        note = Event.objects.get(session=parent, seq=before + 1).data
        assert note == {"child": str(child.id), "at_seq": history.points[name], "policy": policy, "by": "owner"}


def test_fork_after_compaction_keeps_the_task(history: History, owner: Any, fake_llm: Any) -> None:
    """The copied compaction hides the session's first user message, which
    the next compaction's Task block quotes: the fork's summary still starts
    with the parent's task."""
    child = forks.fork(history.parent.id, history.points["compacted"], "historical", user=owner)
    turn(fake_llm, child, "next", Reply(text="ok"))
    fake_llm.script(Reply(text="summary of the fork"))
    result = compaction.compact(child.id, manual=True)
    assert result is not None and result.summary.startswith(compaction.TASK_HEADING + "write a")


def test_the_fork_runs_its_own_turns(history: History, owner: Any, fake_llm: Any) -> None:
    """The model of a fork at a step boundary gets exactly the parent's
    history as of that point, and the parent's later history is absent."""
    child = forks.fork(history.parent.id, history.points["step"], "historical", user=owner)
    turn(fake_llm, child, "what now?", Reply(text="fork answer"))
    sent = fake_llm.requests[-1]["messages"]
    assert sent[1:] == [*on_the_wire(derive_messages(history.parent.id, until_seq=history.points["step"])), sent[-1]]
    assert sent[-1] == {"role": "user", "content": "what now?"}
    assert fake_llm.requests[-1]["model"] == "test/m2"  # the main role in force at that point
    assert files(history.parent.id)["a.txt"] == "one-v2" and files(child.id)["a.txt"] == "one"


# ---------------------------------------------------------------- fork points


def test_refused_seq_names_the_nearest_points(history: History, owner: Any) -> None:
    parent = history.parent
    step = history.points["step"]
    start = latest(parent, "step/start", before=step)
    inside = start.seq + 1  # the step's assistant/message
    before, sessions = head(parent), Session.objects.count()
    with pytest.raises(InvalidForkPoint) as info:
        forks.fork(parent.id, inside, "historical", user=owner)
    assert (info.value.before, info.value.after) == (start.seq - 1, step)
    assert f"fork at {start.seq - 1} (before the step) or {step} (after it)" in str(info.value)
    assert info.value.code == "invalid_fork_point" and info.value.status == 422
    with pytest.raises(InvalidForkPoint) as past:
        forks.fork(parent.id, before + 5, "current", user=owner)
    assert past.value.before == before and "past the log's head" in str(past.value)
    with pytest.raises(InvalidForkPoint):
        forks.fork(parent.id, 0, "fresh", user=owner)
    # nothing written anywhere: no session, no event, no document
    assert head(parent) == before and Session.objects.count() == sessions
    assert set(Document.objects.values_list("session_id", flat=True)) == {parent.id}


def test_every_seq_of_a_step_is_refused_and_its_ends_accepted(history: History, owner: Any) -> None:
    """The rule, seq by seq over the whole parent: a seq is a fork point iff
    the newest turn/step marker at or before it is not a step/start."""
    parent = history.parent
    rows = list(Event.objects.filter(session=parent).order_by("seq").values_list("seq", "kind"))
    open_step = False
    for seq, kind in rows:
        if kind == "step/start":
            open_step = True
        elif kind in ("step/end", "turn/end", "turn/start"):
            open_step = False
        if open_step:
            with pytest.raises(InvalidForkPoint):
                forks.resolve_point(parent.id, seq, head(parent))
        else:
            assert forks.resolve_point(parent.id, seq, head(parent)).at_seq == seq


# ---------------------------------------------------------------- permissions


def test_no_fork_of_a_session_you_cannot_read(history: History, make_user: Any, make_reviewer: Any) -> None:
    stranger = make_user("stranger")
    before, sessions = head(history.parent), Session.objects.count()
    with pytest.raises(UnknownSession):
        forks.fork(history.parent.id, history.points["mid"], "historical", user=stranger)
    with pytest.raises(UnknownSession):
        forks.edit_and_resend(history.parent.id, 3, "edited", user=stranger)
    assert head(history.parent) == before and Session.objects.count() == sessions
    # a reviewer may read it, so may fork it; the fork is the reviewer's
    reviewer = make_reviewer("rev")
    child = forks.fork(history.parent.id, history.points["mid"], "historical", user=reviewer)
    assert child.owner_id == reviewer.pk


def test_an_operators_hold_is_not_escaped_by_forking(history: History, owner: Any) -> None:
    parent = history.parent
    operators.revoke(parent.id, by="ops", reason="abuse")
    before, sessions = head(parent), Session.objects.count()
    with pytest.raises(SessionRevoked):
        forks.fork(parent.id, history.points["mid"], "current", user=owner)
    # the documents are copied under the lock: nothing of a fork is left by the refusal
    assert set(Document.objects.values_list("session_id", flat=True)) == {parent.id}
    operators.restore(parent.id, by="ops")
    operators.suspend("session", str(parent.id), by="ops")
    with pytest.raises(NotAllowed):
        forks.fork(parent.id, history.points["mid"], "fresh", user=owner)
    assert kinds(parent, before) == ["session/restored", "session/suspended"]
    assert Session.objects.count() == sessions and files(parent.id) == history.states["head"].files
    operators.resume("session", str(parent.id), by="ops")
    assert forks.fork(parent.id, history.points["mid"], "fresh", user=owner).status == "idle"


# ---------------------------------------------------------------- fork of a fork


def test_fork_of_a_fork(history: History, owner: Any, fake_llm: Any) -> None:
    parent = history.parent
    child = forks.fork(parent.id, history.points["step"], "historical", user=owner)
    turn(fake_llm, child, "write d", write("d.txt", "four"), Reply(text="wrote d"))
    seed = forks.seed_upto(child.id)
    # inside the child's seed: refused, naming the seed's end
    with pytest.raises(InvalidForkPoint) as info:
        forks.fork(child.id, seed - 1, "historical", user=owner)
    assert info.value.after == seed
    grandchild = forks.fork(child.id, head(child), "historical", user=owner)
    assert derive_messages(grandchild.id) == derive_messages(child.id)
    assert files(grandchild.id) == {"a.txt": "one", "b.txt": "two", "d.txt": "four"}
    assert child.model_main == Session.objects.get(id=grandchild.id).model_main == "test/m2"
    # a historical fork of the child at its seed: the workspace the child started with
    at_seed = forks.fork(child.id, seed, "historical", user=owner)
    assert files(at_seed.id) == {"a.txt": "one", "b.txt": "two"}
    # a current fork's seed snapshot is what a historical fork of it starts from
    current = forks.fork(parent.id, history.points["mid"], "current", user=owner)
    assert files(current.id) == history.states["head"].files
    again = forks.fork(current.id, head(current), "historical", user=owner)
    assert files(again.id) == history.states["head"].files
    assert derive_messages(again.id) == derive_messages(parent.id, until_seq=history.points["mid"])


# ---------------------------------------------------------------- open turns


def test_parked_approval_is_not_copied(fake_llm: Any, owner: Any, manual_worker: None, make_reviewer: Any) -> None:
    asking = AgentProfile.objects.create(
        name="ask", roles={"main": "test/model"}, builtin_tools=["workspace.write"], allow_floor=["*"]
    )
    parent = services.create_session(owner, asking)
    turn(fake_llm, parent, "hello", Reply(text="hi"))
    fake_llm.script(write("x.txt", "parked"), Reply(text="written"))
    services.run_turn(parent.id, "write x")
    assert drive(parent.id) == "parked"
    parked_at = head(parent)
    child = forks.fork(parent.id, parked_at, "historical", user=owner)
    forked = Event.objects.get(session=child, seq=1).data
    start = latest(parent, "step/start")
    # the step is open at the head: the fork takes the point before it
    assert forked["at_seq"] == start.seq - 1 and forked["requested_seq"] == parked_at
    child.refresh_from_db()
    assert child.status == "idle" and child.pending_approvals == 0
    assert derive_messages(child.id) == derive_messages(parent.id, until_seq=start.seq - 1)
    assert derive_messages(child.id)[-1] == {"role": "user", "content": "write x"}
    assert files(child.id) == {}
    # the parent still waits for its verdict, and goes on after it
    parent.refresh_from_db()
    assert parent.status == "waiting_approval"
    call_id = Event.objects.get(session=parent, kind="approval/requested").data["call_id"]
    approval_services.decide(parent.id, call_id, "approve", user=make_reviewer("rev"))
    assert drive(parent.id) == "ended"
    assert files(parent.id) == {"x.txt": "parked"} and files(child.id) == {}


def test_the_historical_workspace_has_what_reviewers_let_run(
    fake_llm: Any, owner: Any, manual_worker: None, make_reviewer: Any
) -> None:
    """An approved write with the reviewer's edited arguments is rebuilt as
    it ran; a denied one is not rebuilt at all."""
    asking = AgentProfile.objects.create(
        name="ask", roles={"main": "test/model"}, builtin_tools=["workspace.write"], allow_floor=["*"]
    )
    parent = services.create_session(owner, asking)
    reviewer = make_reviewer("rev")
    fake_llm.script(write("x.txt", "as the model wrote it"), write("y.txt", "denied"), Reply(text="done"))
    services.run_turn(parent.id, "write x and y")
    for verdict, edited in (("approve", {"path": "x.txt", "content": "as the reviewer edited it"}), ("deny", None)):
        assert drive(parent.id) == "parked"
        call_id = latest(parent, "approval/requested").data["call_id"]
        approval_services.decide(parent.id, call_id, verdict, user=reviewer, edited_args=edited)
    assert drive(parent.id) == "ended"
    assert files(parent.id) == {"x.txt": "as the reviewer edited it"}
    child = forks.fork(parent.id, head(parent), "historical", user=owner)
    assert files(child.id) == {"x.txt": "as the reviewer edited it"}


def test_external_effects_are_not_inherited(fake_llm: Any, session: Session, owner: Any, manual_worker: None) -> None:
    """debug.charge's record of its executions stays with the parent, under
    every policy, and no attempt is copied."""
    turn(fake_llm, session, "charge", Reply(tool_calls=[("debug.charge", {})]), Reply(text="charged"))
    assert (workspace_dir(session.id) / "charges.log").is_file()  # the external system's record
    for policy in forks.POLICIES:
        child = forks.fork(session.id, head(session), policy, user=owner)
        assert not (workspace_dir(child.id) / "charges.log").exists(), policy
        assert files(child.id) == {}, policy
        assert not Event.objects.filter(session=child, kind="tool/attempt").exists()


# ---------------------------------------------------------------- edit and regenerate


def test_edit_and_resend(history: History, owner: Any, fake_llm: Any) -> None:
    parent = history.parent
    message = Event.objects.filter(session=parent, kind="user/message", data__text="write b").get()
    fake_llm.script(Reply(text="edited answer"))
    child, receipt = forks.edit_and_resend(parent.id, message.seq, "write b, but politely", user=owner)
    assert receipt.disposition == "started"
    assert drive(child.id) == "ended"
    sent = fake_llm.requests[-1]["messages"][1:]
    assert sent == [
        *on_the_wire(derive_messages(parent.id, until_seq=message.seq - 1)),
        {"role": "user", "content": "write b, but politely"},
    ]
    assert derive_messages(child.id)[-1] == {"role": "assistant", "content": "edited answer"}
    assert Event.objects.get(session=child, seq=1).data["at_seq"] == message.seq - 1
    assert files(child.id) == {"a.txt": "one"}  # b.txt was written after that point


def test_regenerate(history: History, owner: Any, fake_llm: Any) -> None:
    parent = history.parent
    reply = Event.objects.filter(session=parent, kind="assistant/message", data__content="still here").get()
    step = latest(parent, "step/start", before=reply.seq)
    fake_llm.script(Reply(text="still here, again"))
    requests = len(fake_llm.requests)
    child = forks.regenerate(parent.id, reply.seq, user=owner)
    assert drive(child.id) == "ended"
    assert len(fake_llm.requests) == requests + 1  # one model call: the regenerated reply
    # the model saw exactly the messages it saw for the reply: the parent's history before its step
    assert fake_llm.requests[-1]["messages"][1:] == on_the_wire(derive_messages(parent.id, until_seq=step.seq - 1))
    assert derive_messages(child.id) == [
        *derive_messages(parent.id, until_seq=reply.seq - 1),
        {"role": "assistant", "content": "still here, again"},
    ]
    assert Event.objects.get(session=child, seq=1).data["at_seq"] == step.seq - 1  # just before its step
    (start,) = Event.objects.filter(session=child, kind="turn/start").values_list("data", flat=True)
    assert start["regenerate"] is True
    with pytest.raises(InvalidInput):
        forks.regenerate(parent.id, reply.seq - 1, user=owner)  # not an assistant/message
    assert derive_messages(parent.id)[-1] == {"role": "assistant", "content": "wrote c"}  # unaffected


# ---------------------------------------------------------------- a running parent


@pytest.mark.worker
def test_fork_while_the_parent_runs(
    fake_llm: Any, session: Session, owner: Any, start_worker: Any, tmp_path: Path, settings: Any
) -> None:
    """A real worker runs the parent's turn; its second model call hangs
    while the fork is made at the head. The fork takes the last point before
    the open step; the parent's turn goes on, unaffected."""
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    release = threading.Event()
    fake_llm.script(write("a.txt", "one"), Reply(text="partial", hang=release), Reply(text="never used"))
    start_worker(name="a")
    services.inject(session.id, "write a", wake=True)
    wait_for(lambda: len(fake_llm.requests) >= 2, what="the second model call")
    at = head(session)
    step2 = latest(session, "step/start")
    child = forks.fork(session.id, at, "historical", user=owner)
    release.set()
    wait_for(lambda: Session.objects.get(id=session.id).open_turn_seq is None, what="the parent's turn/end")
    forked = Event.objects.get(session=child, seq=1).data
    assert forked["at_seq"] == step2.seq - 1 and forked["requested_seq"] == at
    assert files(child.id) == {"a.txt": "one"}
    assert derive_messages(child.id) == derive_messages(session.id, until_seq=step2.seq - 1)
    # the parent's turn went on: its one forked_to lies inside the step it was
    # running, whose reply then came, and the turn completed
    note = Event.objects.get(session=session, kind="session/forked_to")
    assert note.data["child"] == str(child.id) and note.seq > step2.seq
    reply = latest(session, "assistant/message")
    assert reply.seq > note.seq and reply.data["content"] == "partial"
    assert Event.objects.filter(session=session, kind="turn/end").get().data["status"] == "completed"
    assert len(fake_llm.requests) == 2  # the parent made its two calls; the fork made none
    assert Session.objects.get(id=child.id).status == "idle"
