"""What a LangGraph client may do, in Terret's terms.

Every check and write goes through sessions_app/actions/ (the rulebook the
JSON API and the session socket share): the same permission questions, the
same services, the same errors. This module only translates: a thread is a
session, an assistant a profile, a run a segment of a turn (mapping.py), a
`command.resume` a list of verdicts. Reads are bounded (STATE_WINDOW events
of the kinds in mapping.STATE_KINDS).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from itertools import accumulate
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet

from sessions_app import actions
from sessions_app.errors import ApprovalExpired, InvalidInput, TerretError, UnknownSession
from sessions_app.lg import mapping
from sessions_app.log.reads import newest_window
from sessions_app.log.records import LoggedEvent
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.services import forks, inputs, sessions
from sessions_app.validation import clean_text

STATE_WINDOW = 5000
PENDING_WINDOW = 200
QUEUED_KINDS = ("input/queued", "input/deferred")
MESSAGE_KINDS = ("user/message", "context/injected", "assistant/message", "tool/result")
MAX_PAGE = 100
MULTITASK = ("reject", "enqueue", "interrupt", "rollback")
HISTORY_LIMIT = 10  # the SDKs' default
HISTORY_MAX_BYTES = 4 * 1024 * 1024  # one history answer, whatever the thread's size


class NotSupported(TerretError):
    """A LangGraph feature Terret refuses on purpose (docs/langgraph.md)."""

    code = "not_supported"
    status = 422


class UnknownAssistant(TerretError):
    code = "unknown_assistant"
    status = 404


class UnknownRun(TerretError):
    code = "unknown_run"
    status = 404


class RunNotActive(TerretError):
    code = "run_not_active"
    status = 409


class InputHeld(TerretError):
    """The input was kept, but a budget or a suspension holds it (it runs later)."""

    code = "input_held"
    status = 429


# ---------------------------------------------------------------- reads


@dataclass
class ThreadView:
    session: Session
    tracker: mapping.Tracker
    times: dict[int, datetime]
    snapshots: list[tuple[int, int, str, dict[str, Any] | None]] = field(default_factory=list)


def _window(session_id: uuid.UUID, upto: int | None) -> list[tuple[int, str, Any, datetime]]:
    # Bounded in count and bytes (TERRET_READ_MAX_BYTES), the newest kept.
    return newest_window(session_id, mapping.STATE_KINDS, upto, STATE_WINDOW)


def _phase(tracker: mapping.Tracker) -> str:
    if tracker.parked is not None:
        return "interrupted"
    seg = tracker.current
    if seg is None:
        return "idle"
    return "error" if seg.status == "error" else "busy"


def view(session: Session, *, upto: int | None = None, history: bool = False) -> ThreadView:
    """The thread folded from its (bounded) log, up to `upto`."""
    tracker = mapping.Tracker(str(session.id))
    out = ThreadView(session, tracker, {})
    for seq, kind, data, at in _window(session.id, upto):
        out.times[seq] = at
        change = tracker.feed(LoggedEvent(seq, kind, data))
        if history and (change.message is not None or change.interrupt is not None or change.ended is not None):
            interrupt = tracker.pending_interrupt()
            out.snapshots.append((seq, len(tracker.messages), _phase(tracker), interrupt))
    return out


def head_of(tv: ThreadView) -> int | None:
    """The thread's head checkpoint: the last history-making event (a
    message, a park, a run's end), so that what comes after it (titles,
    usage, a turn's start) does not make the checkpoint a client read look
    old. /state and /history[0] name it; a run from it is no fork."""
    return tv.snapshots[-1][0] if tv.snapshots else None


def thread_status(session: Session) -> str:
    return mapping.THREAD_STATUS.get(session.status, "busy")


def _profile_name(session: Session) -> str:
    return session.profile.name if session.profile else ""


def _checkpoint(session: Session, seq: int) -> dict[str, Any]:
    return {
        "thread_id": str(session.id),
        "checkpoint_ns": "",
        "checkpoint_id": mapping.checkpoint_id(seq),
        "checkpoint_map": None,
    }


def _tasks(session: Session, tv: ThreadView, phase: str, interrupt: dict[str, Any] | None) -> list[dict[str, Any]]:
    if phase == "idle":
        return []
    seg = tv.tracker.segments[-1] if tv.tracker.segments else None
    task_id = str(uuid.uuid5(session.id, f"task:{seg.open_seq if seg else 0}"))
    name = "tools" if phase == "interrupted" else "agent"
    error = seg.error if (seg is not None and phase == "error") else None
    return [
        {
            "id": task_id,
            "name": name,
            "path": ["__pregel_pull", name],
            "error": error,
            "interrupts": [interrupt] if interrupt else [],
            "checkpoint": None,
            "state": None,
            "result": None,
        }
    ]


def _state(
    session: Session,
    tv: ThreadView,
    seq: int,
    n_messages: int,
    phase: str,
    interrupt: dict[str, Any] | None,
    parent: int | None,
) -> dict[str, Any]:
    at = tv.times.get(seq)
    next_nodes = {"idle": [], "interrupted": ["tools"]}.get(phase, ["agent"])
    return {
        "values": {"messages": tv.tracker.messages[:n_messages]},
        "next": next_nodes,
        "tasks": _tasks(session, tv, phase, interrupt),
        "checkpoint": _checkpoint(session, seq),
        "metadata": {
            "source": "loop",
            "step": seq,
            "thread_id": str(session.id),
            "graph_id": _profile_name(session),
            "assistant_id": mapping.assistant_id(_profile_name(session)),
        },
        "created_at": at.isoformat() if at else None,
        "parent_checkpoint": _checkpoint(session, parent) if parent is not None else None,
        "interrupts": [interrupt] if interrupt else [],
    }


def state(user: Any, thread_id: Any, checkpoint: Any = None) -> dict[str, Any]:
    """The thread's state now, or at checkpoint "seq-N" (read-only)."""
    session = actions.session_for(user, thread_id, "view")
    upto = None
    if checkpoint is not None:
        upto = mapping.parse_checkpoint_id(checkpoint)
        if upto is None or upto > session.last_seq:
            raise InvalidInput(f"unknown checkpoint {str(checkpoint)[:64]!r}; checkpoints are 'seq-N'")
    tv = view(session, upto=upto, history=True)
    head = upto if upto is not None else (head_of(tv) or session.last_seq)
    if upto is None:
        phase = {"idle": "idle", "interrupted": "interrupted", "error": "error"}.get(thread_status(session), "busy")
    else:
        phase = _phase(tv.tracker)
    interrupt = tv.tracker.pending_interrupt() if phase == "interrupted" else None
    parent = next((snap[0] for snap in reversed(tv.snapshots) if snap[0] < head), None)
    if head not in tv.times:
        tv.times[head] = session.last_event_at or session.created_at
    return _state(session, tv, head, len(tv.tracker.messages), phase, interrupt, parent)


def _before_seq(before: Any) -> int | None:
    """`before` as the SDK sends it: a checkpoint config or a Checkpoint dict."""
    if before is None:
        return None
    value: Any
    if isinstance(before, str):
        value = before
    elif isinstance(before, dict):
        value = (before.get("configurable") or before).get("checkpoint_id")
    else:
        value = None
    seq = mapping.parse_checkpoint_id(value)
    if seq is None:
        raise InvalidInput("before: expected a checkpoint id 'seq-N'")
    return seq


def history(user: Any, thread_id: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Checkpoints newest first: one after each message and each park; `limit`
    of them (the SDK's default, 10) before `before`, in at most
    HISTORY_MAX_BYTES. Each checkpoint's values are the whole thread up to it,
    so N checkpoints in full would be quadratic: the page's first carries its
    values whole, the others whole while the budget lasts, then as stubs (each
    message's id, type and tool call ids: what a client places messages by),
    marked metadata.terret_values = "stubs". A page cut short by the budget
    ends at a checkpoint; `before` it is the next page."""
    session = actions.session_for(user, thread_id, "view")
    limit = _int(body.get("limit", HISTORY_LIMIT), "limit", 1, 1000)
    before = _before_seq(body.get("before"))
    tv = view(session, history=True)
    snaps = [s for s in tv.snapshots if before is None or s[0] < before]
    sizes = _MessageSizes(tv.tracker.messages)
    budget = HISTORY_MAX_BYTES
    out: list[dict[str, Any]] = []
    for i in range(len(snaps) - 1, -1, -1):
        if len(out) >= limit:
            break
        seq, n, phase, interrupt = snaps[i]
        parent = snaps[i - 1][0] if i > 0 else None
        checkpoint = _state(session, tv, seq, n, phase, interrupt, parent)
        cost = _size({**checkpoint, "values": None}) + sizes.whole(n)
        if out and cost > budget:
            checkpoint["values"] = {"messages": sizes.stubs[:n]}
            checkpoint["metadata"]["terret_values"] = "stubs"
            cost += sizes.stub(n) - sizes.whole(n)
            if cost > budget:
                break
        budget -= cost
        out.append(checkpoint)
    return out


def _size(value: Any) -> int:
    """Its JSON's length as JsonResponse writes it (ASCII, default separators)."""
    return len(json.dumps(value, cls=DjangoJSONEncoder))


class _MessageSizes:
    """Each message's size, whole and as a stub, summed once: a checkpoint's
    values cost O(1) to price, not a serialisation of the thread."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.stubs = [_stub(m) for m in messages]
        self._whole = list(accumulate((_size(m) + 2 for m in messages), initial=0))
        self._stub = list(accumulate((_size(m) + 2 for m in self.stubs), initial=0))

    def whole(self, n: int) -> int:
        return self._whole[n] + 20

    def stub(self, n: int) -> int:
        return self._stub[n] + 20


def _stub(message: dict[str, Any]) -> dict[str, Any]:
    stub: dict[str, Any] = {
        "type": message["type"],
        "content": "",
        "id": message.get("id"),
        "name": message.get("name"),
        "additional_kwargs": {},
        "response_metadata": {"terret_stub": True},
    }
    if message["type"] == "ai":
        calls = message.get("tool_calls") or []
        stub["tool_calls"] = [{"name": c["name"], "args": {}, "id": c["id"], "type": "tool_call"} for c in calls]
        stub["invalid_tool_calls"] = []
    elif message["type"] == "tool":
        stub["tool_call_id"] = message.get("tool_call_id")
        stub["status"] = message.get("status")
    return stub


def thread(session: Session, *, values: bool = True) -> dict[str, Any]:
    tv = view(session) if values else None
    interrupts: dict[str, Any] = {}
    if tv is not None and thread_status(session) == "interrupted":
        interrupt = tv.tracker.pending_interrupt()
        seg = tv.tracker.parked
        if interrupt and seg:
            interrupts[str(uuid.uuid5(session.id, f"task:{seg.open_seq}"))] = [interrupt]
    name = _profile_name(session)
    metadata: dict[str, Any] = {
        "graph_id": name,
        "assistant_id": mapping.assistant_id(name),
        "title": session.title,
        "version": actions.session_version(session),
    }
    parent = actions.session_parent(session)
    if parent is not None:  # a subagent's thread names the thread (and task) that owns it
        metadata["parent_thread_id"], metadata["parent_task_id"] = parent["session_id"], parent["task_id"]
    return {
        "thread_id": str(session.id),
        "created_at": session.created_at.isoformat(),
        "updated_at": (session.last_event_at or session.created_at).isoformat(),
        "state_updated_at": (session.last_event_at or session.created_at).isoformat(),
        "metadata": metadata,
        "status": thread_status(session),
        "values": {"messages": tv.tracker.messages} if tv is not None else None,
        "interrupts": interrupts,
        "config": {},
    }


def get_thread(user: Any, thread_id: Any) -> dict[str, Any]:
    return thread(actions.session_for(user, thread_id, "view"))


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{name} must be a whole number from {low} to {high}")
    return value


def _visible(user: Any) -> QuerySet[Session]:
    return actions.visible(user, Session.objects.select_related("profile"))


def search_threads(user: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    limit = _int(body.get("limit", 10), "limit", 1, MAX_PAGE)
    offset = _int(body.get("offset", 0), "offset", 0, 10**6)
    qs = _visible(user).order_by("-created_at")
    ids = body.get("ids")
    if ids:
        if not isinstance(ids, list):
            raise InvalidInput("ids must be a list of thread ids")
        wanted = [u for u in (_uuid_or_none(i) for i in ids[:MAX_PAGE]) if u is not None]
        qs = qs.filter(id__in=wanted)
    raw = body.get("metadata")
    metadata: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if metadata.get("graph_id"):
        qs = qs.filter(profile__name=clean_text("metadata.graph_id", str(metadata["graph_id"])))
    if metadata.get("assistant_id"):
        # agent-chat-ui searches by assistant_id when it is configured with one.
        wanted_id = clean_text("metadata.assistant_id", str(metadata["assistant_id"]))
        names = [p.name for p in AgentProfile.objects.all() if mapping.assistant_id(p.name) == wanted_id]
        qs = qs.filter(profile__name__in=names)
    status = body.get("status")
    rows = list(qs[offset : offset + limit]) if not status else _by_status(qs, str(status), offset, limit)
    return [thread(s, values=True) for s in rows]


def _by_status(qs: QuerySet[Session], status: str, offset: int, limit: int) -> list[Session]:
    # Status is derived from several columns; filter a bounded candidate set.
    matched = [s for s in qs[:1000] if thread_status(s) == status]
    return matched[offset : offset + limit]


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


# ---------------------------------------------------------------- assistants


def assistant(profile: AgentProfile) -> dict[str, Any]:
    at = profile.created_at.isoformat()
    return {
        "assistant_id": mapping.assistant_id(profile.name),
        "graph_id": profile.name,
        "name": profile.name,
        "description": profile.description or None,
        "config": {},
        "context": {},
        "metadata": {"terret_profile": profile.name},
        "version": actions.newest_version(profile),
        "created_at": at,
        "updated_at": at,
    }


def search_assistants(user: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    limit = _int(body.get("limit", 10), "limit", 1, MAX_PAGE)
    offset = _int(body.get("offset", 0), "offset", 0, 10**6)
    qs = actions.usable_profiles(user)
    for key in ("graph_id", "name"):
        if body.get(key):
            qs = qs.filter(name=clean_text(key, str(body[key])))
    return [assistant(p) for p in qs[offset : offset + limit]]


def get_assistant(user: Any, ref: Any) -> dict[str, Any]:
    return assistant(profile_for(user, ref))


def profile_for(user: Any, ref: Any) -> AgentProfile:
    """A profile by assistant id or by name (the SDK accepts either)."""
    for profile in actions.usable_profiles(user):
        if ref in (profile.name, mapping.assistant_id(profile.name)):
            return profile
    raise UnknownAssistant(f"no assistant {str(ref)[:64]!r}; POST /lg/assistants/search lists yours")


def create_thread(user: Any, body: dict[str, Any]) -> dict[str, Any]:
    """A new session. Its profile: metadata.graph_id or metadata.assistant_id,
    else the caller's first profile by name. A client-chosen thread_id is
    accepted only when it names a thread of theirs and if_exists is do_nothing."""
    if body.get("thread_id"):
        return thread(_existing_thread(user, body))
    metadata: dict[str, Any] = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
    ref = metadata.get("graph_id") or metadata.get("assistant_id")
    if not ref:
        # As LangGraph's server does, the thread takes its first run's
        # assistant (bind_profile in start_run), not an arbitrary default.
        if not actions.usable_profiles(user).exists():
            raise UnknownAssistant("there is no profile to start a thread with")
        return thread(sessions.create_unbound_session(user))
    created = actions.create_session(user, profile_for(user, ref).name)
    return thread(actions.session_for(user, created.id, "view"))


def _existing_thread(user: Any, body: dict[str, Any]) -> Session:
    """A client-chosen thread id: only `if_exists: do_nothing` naming a thread
    of the caller's. A thread of someone else's gets the answer a missing one
    gets, so the answer does not tell which ids exist."""
    refused = NotSupported("thread ids are chosen by Terret: create the thread without thread_id")
    wanted = _uuid_or_none(body["thread_id"])
    if wanted is None or body.get("if_exists") != "do_nothing":
        raise refused
    try:
        return actions.session_for(user, wanted, "view")
    except UnknownSession:
        raise refused from None


# ---------------------------------------------------------------- runs


def run_record(
    session: Session, seg: mapping.Segment, times: dict[int, datetime], strategy: str = "reject"
) -> dict[str, Any]:
    name = _profile_name(session)
    opened = times.get(seg.open_seq) or session.created_at
    updated = times.get(seg.updated_seq) or opened
    return {
        "run_id": mapping.run_id(session.id, seg.open_seq),
        "thread_id": str(session.id),
        "assistant_id": mapping.assistant_id(name),
        "created_at": opened.isoformat(),
        "updated_at": updated.isoformat(),
        "status": seg.status,
        "metadata": {"open_seq": seg.open_seq, "turn_seq": seg.turn_seq, "end_seq": seg.end_seq},
        "multitask_strategy": strategy,
        "kwargs": {},
        "cancel_reason": None,
    }


def find_run(session: Session, run_id: Any) -> tuple[ThreadView, mapping.Segment]:
    tv = view(session)
    for seg in reversed(tv.tracker.segments):
        if mapping.run_id(session.id, seg.open_seq) == str(run_id):
            return tv, seg
    pending = _pending_run(session, str(run_id), tv)
    if pending is None:
        raise UnknownRun(f"no run {str(run_id)[:64]!r} in thread {session.id}")
    return tv, pending


def _pending_run(session: Session, run_id: str, tv: ThreadView) -> mapping.Segment | None:
    """A run named by queued input that no turn has opened yet: `pending`, or
    `interrupted` once the input was withdrawn (bounded: the newest inputs)."""
    rows = (
        Event.objects.filter(session_id=session.id, kind__in=QUEUED_KINDS)
        .order_by("-seq")
        .values_list("seq", "created_at")[:PENDING_WINDOW]
    )
    for seq, at in rows:
        if mapping.run_id(session.id, seq) != run_id:
            continue
        tv.times[seq] = at
        gone = Event.objects.filter(session_id=session.id, kind="input/withdrawn", data__source_seq=seq)
        withdrawn = gone.values_list("seq", flat=True).first()
        if withdrawn is None:
            return mapping.Segment(open_seq=seq, turn_seq=0, status="pending", updated_seq=seq)
        return mapping.Segment(open_seq=seq, turn_seq=0, status="interrupted", end_seq=withdrawn, updated_seq=seq)
    return None


def get_run(user: Any, thread_id: Any, run_id: Any) -> dict[str, Any]:
    session = actions.session_for(user, thread_id, "view")
    tv, seg = find_run(session, run_id)
    return run_record(session, seg, tv.times)


def list_runs(user: Any, thread_id: Any, limit: int, offset: int, status: str | None) -> list[dict[str, Any]]:
    session = actions.session_for(user, thread_id, "view")
    tv = view(session)
    segs = [s for s in reversed(tv.tracker.segments) if status is None or s.status == status]
    return [run_record(session, s, tv.times) for s in segs[offset : offset + limit]]


@dataclass(frozen=True)
class Started:
    """A run that a request opened or joined: where its stream starts."""

    session_id: uuid.UUID
    run_id: str
    open_seq: int


@dataclass(frozen=True)
class Said:
    """What a run's input says: the user's text, and the tool messages it
    carries (call id -> content): agent-chat-ui answers a pending tool call
    with one when the user types at an interrupt."""

    text: str
    tool_replies: dict[str, str] = field(default_factory=dict)


def _said(input_: Any) -> Said:
    """The user's text from LangGraph input: {"messages": [...]} (dicts with
    role or type, content a string or a list of text parts), or a string.
    Checked as inject checks it, so it is refused before anything is written."""
    if isinstance(input_, str):
        return Said(inputs.check_text(input_))
    if not isinstance(input_, dict):
        raise InvalidInput("input must be an object with messages")
    messages = input_.get("messages")
    if isinstance(messages, dict | str):
        messages = [messages]
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("input.messages must name at least one message")
    parts: list[str] = []
    replies: dict[str, str] = {}
    for m in messages:
        if isinstance(m, str):
            parts.append(m)
            continue
        if not isinstance(m, dict):
            raise InvalidInput("input.messages: each message is an object or a string")
        kind = m.get("role") or m.get("type")
        if kind == "tool" and isinstance(m.get("tool_call_id"), str):
            content = m.get("content")
            replies[m["tool_call_id"]] = content if isinstance(content, str) else ""
            continue
        if kind not in ("user", "human"):
            raise InvalidInput("input.messages: only user (human) messages can be sent")
        parts.append(_content_text(m.get("content")))
    return Said(inputs.check_text("\n\n".join(p for p in parts if p)), replies)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text"]
        if len(texts) == len(content):
            return "\n".join(texts)
    raise InvalidInput("message content must be a string or a list of text parts")


def _check_options(user: Any, session: Session, body: dict[str, Any]) -> tuple[str, AgentProfile | None]:
    """The multitask strategy, and the profile an unbound thread's first run
    binds it to (None: the thread has its profile)."""
    strategy = body.get("multitask_strategy") or "reject"
    if strategy not in MULTITASK:
        raise InvalidInput(f"multitask_strategy must be one of {', '.join(MULTITASK)}")
    if strategy == "rollback":
        raise NotSupported("multitask_strategy rollback is refused: Terret's log is append-only")
    if body.get("interrupt_before") or body.get("interrupt_after"):
        raise NotSupported("interrupt_before / interrupt_after: Terret interrupts at tool approvals only")
    ref = body.get("assistant_id")
    if session.profile is None:
        bind = profile_for(user, ref) if ref else actions.usable_profiles(user).first()
        if bind is None:
            raise UnknownAssistant("there is no profile to run this thread with")
        return str(strategy), bind
    if ref and ref not in (_profile_name(session), mapping.assistant_id(_profile_name(session))):
        raise InvalidInput(
            f"thread {session.id} runs assistant {_profile_name(session)!r}; a thread keeps the assistant it began with"
        )
    return str(strategy), None


def _fork_point(session: Session, body: dict[str, Any]) -> int | None:
    """The earlier checkpoint a run asks to start from (None: the head, by
    head_of's rule: no history-making event came after it)."""
    checkpoint = body.get("checkpoint")
    point = body.get("checkpoint_id") or (checkpoint.get("checkpoint_id") if isinstance(checkpoint, dict) else None)
    if point is None:
        return None
    seq = mapping.parse_checkpoint_id(point)
    if seq is None or seq > session.last_seq:
        raise InvalidInput(f"unknown checkpoint {str(point)[:64]!r}; checkpoints are 'seq-N'")
    head = head_of(view(session, history=True))
    return None if head is None or seq >= head else seq


def _no_input(value: Any) -> bool:
    """Input that says nothing: absent, {}, "" or {"messages": []} (what
    agent-chat-ui sends beside a command)."""
    if value is None or value == "" or value == {}:
        return True
    return isinstance(value, dict) and set(value) <= {"messages"} and not value.get("messages")


def start_run(user: Any, thread_id: Any, body: dict[str, Any]) -> Started:
    """Open (or resume into) a run: input becomes the user's message, a
    command.resume the verdicts on the parked calls. A run from an earlier
    checkpoint runs in a fork (a new thread: forks.fork, historical); the
    log is never rewritten, and the run's Content-Location names the fork.
    Everything a request says is checked before anything is written, so a
    refused request changes nothing (no fork, no binding, no verdict)."""
    session = actions.session_for(user, thread_id, "view")
    strategy, bind = _check_options(user, session, body)
    command = body.get("command")
    # With a command, LangGraph's server lets the command win over an empty input.
    said = None if _no_input(body.get("input")) else _said(body.get("input"))
    if command is not None and said is not None:
        raise InvalidInput("send input or command, not both")
    at = _fork_point(session, body)
    if at is not None:
        if command is not None:
            raise NotSupported("a resume answers the thread's own interrupt; it cannot start from a checkpoint")
        if said is None:
            return _regenerate(user, session, at)
        child = forks.fork(session.id, at, "historical", user=user)  # the caller's own: they drive it
        return _inject(user, actions.session_for(user, child.id, "view"), said.text, strategy)
    if command is not None:
        return _resume(user, session, command)
    if said is None:
        raise InvalidInput("a run needs input (messages) or command.resume")
    if bind is not None:
        actions.session_for(user, session.id, "drive")
        sessions.bind_profile(session.id, bind)
    if strategy == "reject":
        tv = view(session)
        if tv.tracker.pending_interrupt() is not None:
            return _answer_interrupt(user, session, tv, said)
    return _inject(user, session, said.text, strategy)


def _regenerate(user: Any, session: Session, at: int) -> Started:
    """A run with no input from the checkpoint just before an AI message asks
    the model for that reply again (forks.regenerate): a fork, by Terret's rule."""
    nxt = (
        Event.objects.filter(session_id=session.id, seq__gt=at, kind__in=MESSAGE_KINDS)
        .order_by("seq")
        .values_list("seq", "kind")
        .first()
    )
    if nxt is None or nxt[1] != "assistant/message":
        raise InvalidInput(
            f"a run from checkpoint seq-{at} needs input; with none it regenerates the AI message that follows it"
        )
    child = forks.regenerate(session.id, nxt[0], user=user)
    turn_seq = Session.objects.filter(id=child.id).values_list("open_turn_seq", flat=True).first()
    if turn_seq is None:  # it ended already: the fork's last turn is the run
        turn_seq = (
            Event.objects.filter(session_id=child.id, kind="turn/start")
            .order_by("-seq")
            .values_list("seq", flat=True)[0]
        )
    return Started(child.id, mapping.run_id(child.id, turn_seq), turn_seq)


def _answer_interrupt(user: Any, session: Session, tv: ThreadView, said: Said) -> Started:
    """Input typed at an interrupt: every parked call is denied (the tool
    message naming one gives its reason), and the text rides the resumed turn's
    next step, so the model reads the denials and the text together. It is
    queued before the verdicts, so the resumed step cannot miss it.

    Sending is a drive; denying is a reviewer's decision. A driver who may
    not decide approvals (an owner outside the reviewers) is answered as on
    every other door: the text is queued, and rides the turn once a reviewer
    has decided."""
    actions.session_for(user, session.id, "drive")
    if not actions.allowed(user, session, "approve"):
        receipt = actions.inject(user, session.id, said.text, True, None, lane="steer")
        return Started(session.id, mapping.run_id(session.id, receipt.seq), receipt.seq)
    waiting = sorted(tv.tracker.waiting.values(), key=lambda r: r.seq)
    actions.inject(user, session.id, said.text, True, None, lane="steer")
    last = None
    for request in waiting:
        reason = said.tool_replies.get(request.call_id) or "the user sent a new message instead"
        last = actions.decide(user, session.id, request.call_id, "deny", reason, request.seq)
    assert last is not None
    return Started(session.id, mapping.run_id(session.id, last.seq), last.seq)


def _inject(user: Any, session: Session, text: str, strategy: str) -> Started:
    """The input through the lanes' inject: reject answers 409 while a turn
    is open (decided under the row lock, nothing appended), enqueue makes it
    a follow-up, interrupt cancels the running turn and opens the next."""
    receipt = actions.inject(user, session.id, text, True, None, multitask_strategy=strategy)
    if receipt.disposition == "held":
        raise InputHeld(f"the input was kept but is held: {receipt.held_reason}; it runs when allowed")
    if receipt.disposition == "started" and receipt.turn_seq is not None:
        return Started(session.id, mapping.run_id(session.id, receipt.turn_seq), receipt.turn_seq)
    # Queued for the next turn: that run is named by the input (mapping.py).
    return Started(session.id, mapping.run_id(session.id, receipt.seq), receipt.seq)


def _decisions(command: Any, interrupt_key: str) -> list[Any]:
    if not isinstance(command, dict):
        raise InvalidInput("command must be an object")
    unknown = [k for k in ("update", "goto") if command.get(k) is not None]
    if unknown:
        raise NotSupported(f"command.{unknown[0]} is refused: only command.resume is supported")
    resume = command.get("resume")
    if isinstance(resume, dict) and interrupt_key in resume and "decisions" not in resume:
        resume = resume[interrupt_key]  # a resume map keyed by interrupt id
    if not isinstance(resume, dict) or not isinstance(resume.get("decisions"), list):
        raise InvalidInput("command.resume must be {decisions: [...]}, one per action request")
    return list(resume["decisions"])


def _verdict(decision: Any, request: mapping.Request) -> tuple[str, str, dict[str, Any] | None]:
    if not isinstance(decision, dict) or decision.get("type") not in ("approve", "reject", "edit"):
        raise InvalidInput("each decision is {type: approve | reject | edit}")
    kind = decision["type"]
    if kind == "approve":
        return "approve", "", None
    if kind == "reject":
        message = decision.get("message") or ""
        if not isinstance(message, str):
            raise InvalidInput("a reject decision's message must be a string")
        return "deny", message, None
    action = decision.get("edited_action")
    if not isinstance(action, dict) or not isinstance(action.get("arguments", action.get("args")), dict):
        raise InvalidInput("an edit decision needs edited_action {name, arguments}")
    if action.get("name", request.name) != request.name:
        raise NotSupported("an edit may change a call's arguments, not its tool")
    edited = action.get("arguments", action.get("args"))
    return "approve", "", dict(edited or {})


def _resume(user: Any, session: Session, command: Any) -> Started:
    actions.session_for(user, session.id, "approve")
    tv = view(session)
    interrupt = tv.tracker.pending_interrupt()
    if interrupt is None and tv.tracker.expired:
        raise ApprovalExpired(f"thread {session.id}: its interrupt expired before a decision came")
    if interrupt is None:
        raise RunNotActive(f"thread {session.id} has no interrupt to resume")
    waiting = sorted(tv.tracker.waiting.values(), key=lambda r: r.seq)
    decisions = _decisions(command, interrupt["id"])
    if len(decisions) != len(waiting):
        raise InvalidInput(f"{len(decisions)} decisions for {len(waiting)} action requests; send one per request")
    # Validate every decision before applying any, so bad input changes nothing.
    verdicts = [_verdict(d, r) for d, r in zip(decisions, waiting, strict=True)]
    last = None
    for request, (verdict, reason, edited) in zip(waiting, verdicts, strict=True):
        last = actions.decide(user, session.id, request.call_id, verdict, reason, request.seq, edited_args=edited)
    assert last is not None
    return Started(session.id, mapping.run_id(session.id, last.seq), last.seq)


def cancel_run(user: Any, thread_id: Any, run_id: Any, action: str) -> dict[str, Any]:
    if action == "rollback":
        raise NotSupported("cancel action rollback is refused: Terret's log is append-only")
    if action != "interrupt":
        raise InvalidInput("action must be interrupt")
    session = actions.session_for(user, thread_id, "drive")
    _, seg = find_run(session, run_id)
    if seg.status == "pending":
        actions.withdraw(user, session.id, seg.open_seq)  # not taken in yet: it never runs
        return get_run(user, session.id, run_id)
    open_turn = Session.objects.filter(id=session.id).values_list("open_turn_seq", flat=True).first()
    if open_turn is None or open_turn != seg.turn_seq:
        raise RunNotActive(f"run {run_id} has ended ({seg.status})")
    actions.cancel(user, session.id)
    return get_run(user, session.id, run_id)


def run_withdrawn(session_id: uuid.UUID, open_seq: int) -> bool:
    """Whether the queued input that names a pending run was withdrawn (it
    never runs): one query, so a join on a pending run need not re-read the thread."""
    gone = Event.objects.filter(session_id=session_id, kind="input/withdrawn", seq__gt=open_seq)
    return gone.filter(data__source_seq=open_seq).exists()


def run_ended(session_id: uuid.UUID, run_id: str) -> bool:
    session = Session.objects.select_related("profile").get(id=session_id)
    _, seg = find_run(session, run_id)
    return seg.ended


def values_of(user: Any, thread_id: Any) -> dict[str, Any]:
    session = actions.session_for(user, thread_id, "view")
    return {"messages": view(session).tracker.messages}


def parse_thread(value: Any) -> uuid.UUID:
    return actions.parse_session_id(value)


def cancel_turn(user: Any, session_id: uuid.UUID) -> None:
    actions.cancel(user, session_id)
