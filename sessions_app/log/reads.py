"""Reads of the log and its projections. Every read here is bounded: by a
turn (at most MAX_STEPS steps), by an index range, or by an explicit limit."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import BigIntegerField, Exists, Func, OuterRef, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Length

from sessions_app.log import backends
from sessions_app.log.catalogue import MODEL_ROLES, MODEL_VISIBLE
from sessions_app.log.records import Intake, LoggedEvent
from sessions_app.log.runs import EVENT_TABLE, SESSION_TABLE
from sessions_app.log.upcasters import lift, lift_shown, shown_raw
from sessions_app.models import Agent, Event, Session

EVENT_PAGE_MAX = 1000
ViewRow = tuple[int, str, dict[str, Any]]
# An event row as the domain reads select it: the version goes with the
# payload so lift() brings an older payload to the catalogue's version.
EVENT_ROW = ("seq", "kind", "data", "version")


def logged(seq: int, kind: str, data: Any, version: int) -> LoggedEvent:
    """A selected row (EVENT_ROW) as a LoggedEvent, its payload lifted to the catalogue's version."""
    return LoggedEvent(seq, kind, lift(kind, version, data))


PAGE = 1000
EventFrame = tuple[int, str]  # (seq, socket frame text)


def get_session(session_id: uuid.UUID | str) -> Session:
    return Session.objects.select_related("profile", "owner").get(id=session_id)


def agent_for_session(session_id: uuid.UUID | str) -> Agent | None:
    return Agent.objects.select_related("profile").filter(session_id=session_id).first()


def blocked_info(session: Session) -> dict[str, Any] | None:
    """{reason, attempts, code, what, since} of a blocked session's turn/blocked
    (code None for one recorded before codes; what None unless a definition
    is missing); None when not blocked."""
    if session.blocked_seq is None or session.open_turn_seq is None:
        return None
    row = Event.objects.filter(session_id=session.id, seq=session.blocked_seq).values("data", "created_at").first()
    if row is None:
        return None
    data = row["data"]
    return {
        "reason": data.get("reason", ""),
        "attempts": data.get("attempts", 0),
        "code": data.get("code"),
        "what": data.get("what"),
        "since": row["created_at"],
    }


def waiting_info(session: Session) -> dict[str, Any] | None:
    """{reason, since} of a session whose work waits for an agent slot (agent/waiting); None otherwise."""
    if session.waiting_seq is None:
        return None
    row = Event.objects.filter(session_id=session.id, seq=session.waiting_seq).values("data", "created_at").first()
    if row is None:
        return None
    return {"reason": row["data"].get("reason", ""), "since": row["created_at"]}


def stall_stands(session: Session) -> bool:
    """Whether the open turn's turn/stalled of no progress still stands:
    nothing was appended after it, and its holder's progress mark (streamed
    text, written with the lease renewal) is no later than it. The sweep's
    test (runtime/progress.py, STALL_STANDS) is the same, in SQL."""
    if session.stalled_seq is None or session.open_turn_seq is None or session.stalled_seq != session.last_seq:
        return False
    return session.progress_at is None or session.last_event_at is None or session.progress_at <= session.last_event_at


def stalled_since(session: Session) -> datetime | None:
    """Since when the open turn has made no progress, while its turn/stalled
    stands (stall_stands); None otherwise."""
    if not stall_stands(session) or session.stalled_seq is None:
        return None
    data = Event.objects.filter(session_id=session.id, seq=session.stalled_seq).values_list("data", flat=True).first()
    if not data or "since" not in data:
        return None
    return datetime.fromisoformat(data["since"])


def turn_events(session_id: uuid.UUID | str, turn_seq: int) -> list[LoggedEvent]:
    """The open turn: its turn/start and everything after it."""
    rows = Event.objects.filter(session_id=session_id, seq__gte=turn_seq).order_by("seq").values_list(*EVENT_ROW)
    return [logged(*r) for r in rows]


TURN_VIEW_KINDS = sorted(MODEL_VISIBLE)


def turn_view_filter(session: str, start: str, turn_seq: str, alias: str = "") -> str:
    """The turn view's condition on event rows (`alias.` prefixed), given SQL
    for the session id, the start seq and the turn's seq; TURN_VIEW_KINDS
    follow as its last parameters. Shared by turn_view and the lease claim,
    which reads the same rows in its own statement."""
    e = f"{alias}." if alias else ""
    marks = ", ".join(["%s"] * len(TURN_VIEW_KINDS))
    return f"{e}session_id = {session} AND {e}seq >= {start} AND ({e}seq >= {turn_seq} OR {e}kind IN ({marks}))"


def turn_view(session_id: uuid.UUID, start: int, turn_seq: int) -> list[ViewRow]:
    """What a turn runner loads: from `start` (the latest compaction's seq),
    every model-visible event, and every event from `turn_seq` on. A
    compaction inside the open turn lies after `turn_seq`: then the turn's
    events before it are read too (and the compaction replaces the model's
    view there). A fixed statement of the backend's: it runs once per drive,
    on the hottest path there is."""
    sql = f"SELECT seq, kind, data, version FROM {EVENT_TABLE} WHERE {turn_view_filter('%s', '%s', '%s')} ORDER BY seq"
    rows = backends.current().fetch(sql, [session_id, min(start, turn_seq), turn_seq, *TURN_VIEW_KINDS])
    # SQLite keeps the payload as text; psycopg decodes jsonb itself.
    return [
        (
            int(r["seq"]),
            r["kind"],
            lift(r["kind"], r["version"], json.loads(r["data"]) if isinstance(r["data"], str) else r["data"]),
        )
        for r in rows
    ]


def policy_row(session_id: uuid.UUID) -> tuple[int | None, Any] | None:
    """The session's policy in force (policy_seq: its policy/updated, None:
    none yet) and profile id, by primary key; None for no such session."""
    sql = f"SELECT policy_seq, profile_id FROM {SESSION_TABLE} WHERE id = %s"
    rows = backends.current().fetch(sql, [session_id])
    return (rows[0]["policy_seq"], rows[0]["profile_id"]) if rows else None


def events_since(session_id: uuid.UUID | str, seen: int, limit: int = 1000) -> list[LoggedEvent]:
    """What was committed after `seen` (a driver catching up between steps)."""
    rows = Event.objects.filter(session_id=session_id, seq__gt=seen).order_by("seq").values_list(*EVENT_ROW)[:limit]
    return [logged(*r) for r in rows]


def pending_inputs(session_id: uuid.UUID | str, inbox_seq: int, bound: Intake) -> Waiting:
    """Steer-lane input not yet consumed: input/queued events after the inbox
    cursor that no input/withdrawn took back; a bounded prefix."""
    return _waiting(session_id, "input/queued", inbox_seq, bound)


def pending_deferred(
    session_id: uuid.UUID | str, cursor: int, bound: Intake, *, through_follow_up: bool = True
) -> Waiting:
    """Follow-ups and passive writes not yet taken in (input/deferred after
    the deferred cursor, less the withdrawn), in arrival order: a bounded
    prefix that ends at the first follow-up (included, or not)."""
    return _waiting(session_id, "input/deferred", cursor, bound, follow_up=through_follow_up)


@dataclass(frozen=True)
class Waiting:
    """A bounded prefix of a lane's waiting input, and whether more waits
    after it (in the lane, within the read's stop)."""

    items: list[LoggedEvent]
    more: bool


class _OctetLength(Func):
    """The UTF-8 length of a text: what the intake bound counts."""

    function = "OCTET_LENGTH"
    output_field = BigIntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra)


def _waiting_rows(session_id: uuid.UUID | str, kind: str, cursor: int) -> QuerySet[Event]:
    """A lane's input after its cursor that no input/withdrawn took back,
    decided in SQL so a read can stop early (withdrawals are few, and each
    probe walks the (session, kind, seq) index)."""
    withdrawn = Event.objects.annotate(source=Cast(KeyTextTransform("source_seq", "data"), BigIntegerField())).filter(
        session_id=OuterRef("session_id"), kind="input/withdrawn", seq__gt=OuterRef("seq"), source=OuterRef("seq")
    )
    return Event.objects.filter(session_id=session_id, kind=kind, seq__gt=cursor).exclude(Exists(withdrawn))


def _waiting(
    session_id: uuid.UUID | str, kind: str, cursor: int, bound: Intake, *, follow_up: bool | None = None
) -> Waiting:
    """The bounded prefix, read in two passes so the backlog never reaches
    this process: first each candidate's seq, lane and text size (LIMIT:
    one more than the count bound, to know whether more waits), then the
    text of the prefix that fits the byte bound. `follow_up`: stop at the
    deferred lane's first follow-up, taking it (True) or not (False)."""
    sizes = (
        _waiting_rows(session_id, kind, cursor)
        .annotate(size=_OctetLength(KeyTextTransform("text", "data")), lane=KeyTextTransform("lane", "data"))
        .order_by("seq")
        .values_list("seq", "size", "lane")[: bound.items + 1]
    )
    taken: list[int] = []
    total = 0
    more = False
    for seq, size, lane in sizes:
        stop = follow_up is not None and lane == "follow_up"
        if stop and not follow_up:
            break  # the follow-up waits for a turn of its own
        if len(taken) == bound.items or (taken and total + int(size or 0) > bound.max_bytes):
            more = True
            break
        taken.append(seq)
        total += int(size or 0)
        if stop:
            break
    if not taken:
        return Waiting([], more)
    rows = Event.objects.filter(session_id=session_id, seq__in=taken).order_by("seq").values_list(*EVENT_ROW)
    return Waiting([logged(*r) for r in rows], more)


@dataclass(frozen=True)
class Backlog:
    """What waits in both lanes (steers and deferred input), read as each
    input's seq, text size and lane only: never the text. `items` is cut at
    the read's limit (`complete` False then)."""

    items: list[tuple[int, int, str]]
    complete: bool

    @property
    def count(self) -> int:
        return len(self.items)

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _ in self.items)

    def passive(self) -> list[int]:
        """The seqs of the waiting passive writes, oldest first."""
        return [seq for seq, _, lane in self.items if lane == "passive"]


def backlog(session_id: uuid.UUID | str, inbox_seq: int, deferred_cursor: int, limit: int) -> Backlog:
    """Every waiting input of the session (the inbox bound's read,
    runtime/admission.check_room), at most `limit` + 1 rows."""
    rows: list[tuple[int, int, str]] = []
    for kind, cursor in (("input/queued", inbox_seq), ("input/deferred", deferred_cursor)):
        found = (
            _waiting_rows(session_id, kind, cursor)
            .annotate(size=_OctetLength(KeyTextTransform("text", "data")), lane=KeyTextTransform("lane", "data"))
            .order_by("seq")
            .values_list("seq", "size", "lane")[: limit + 1]
        )
        rows.extend((seq, int(size or 0), lane or "steer") for seq, size, lane in found)
    rows.sort()
    return Backlog(rows[: limit + 1], len(rows) <= limit)


def first_waiting(
    session_id: uuid.UUID | str,
    kind: str,
    cursor: int,
    *,
    wake: bool | None = None,
    lane: str | None = None,
    other_than: int | None = None,
) -> int | None:
    """The seq of a lane's first waiting input (a woken steer, a follow-up),
    less `other_than`; None when none waits. One row's seq: no text read."""
    rows = _waiting_rows(session_id, kind, cursor)
    if wake is not None:
        rows = rows.filter(data__wake=wake)
    if lane is not None:
        rows = rows.filter(data__lane=lane)
    if other_than is not None:
        rows = rows.exclude(seq=other_than)
    return rows.order_by("seq").values_list("seq", flat=True).first()


def input_fate(session_id: uuid.UUID | str, seq: int) -> tuple[LoggedEvent | None, LoggedEvent | None]:
    """What became of the input at `seq`: the event that placed it in the
    transcript or withdrew it (None while it waits), and the turn/end that
    answered the turn it was placed in (None until that turn ends)."""
    took = (
        Event.objects.filter(
            session_id=session_id,
            seq__gt=seq,
            kind__in=("user/message", "context/injected", "input/withdrawn"),
            data__source_seq=seq,
        )
        .order_by("seq")
        .values_list(*EVENT_ROW)
        .first()
    )
    placed = logged(*took) if took else None
    if placed is None or placed.kind == "input/withdrawn":
        return placed, None
    return placed, _end_after(session_id, placed.seq)


def _end_after(session_id: uuid.UUID | str, seq: int) -> LoggedEvent | None:
    row = (
        Event.objects.filter(session_id=session_id, kind="turn/end", seq__gt=seq)
        .order_by("seq")
        .values_list(*EVENT_ROW)
        .first()
    )
    return logged(*row) if row else None


def event_at(session_id: uuid.UUID | str, seq: int) -> LoggedEvent | None:
    row = Event.objects.filter(session_id=session_id, seq=seq).values_list(*EVENT_ROW).first()
    return logged(*row) if row else None


def latest_seq_of(session_id: uuid.UUID | str, kind: str, *, at_or_before: int) -> int | None:
    """The seq of the newest event of `kind` at or before `at_or_before`."""
    return (
        Event.objects.filter(session_id=session_id, kind=kind, seq__lte=at_or_before)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )


def turn_start_before(session_id: uuid.UUID | str, seq: int) -> int | None:
    """The seq of the turn/start that opened the turn holding the event at `seq`."""
    return latest_seq_of(session_id, "turn/start", at_or_before=seq)


def answered_by(session_id: uuid.UUID | str, seq: int) -> LoggedEvent | None:
    """The turn/end of the turn that holds the event at `seq`, if it ended."""
    return _end_after(session_id, seq)


def latest_of_kind(session_id: uuid.UUID | str, kind: str) -> LoggedEvent | None:
    row = Event.objects.filter(session_id=session_id, kind=kind).order_by("-seq").values_list(*EVENT_ROW).first()
    return logged(*row) if row else None


def model_overrides(session_id: uuid.UUID | str) -> dict[str, str]:
    """The latest model/updated spec per role (a projection on the session row)."""
    columns = [f"model_{role}" for role in MODEL_ROLES]
    row = Session.objects.filter(id=session_id).values_list(*columns).first()
    return {role: spec for role, spec in zip(MODEL_ROLES, row or (), strict=False) if spec}


def events_after(session_id: uuid.UUID | str, after: int, limit: int = 500) -> Page:
    """At most `limit` events after `after`, and at most TERRET_READ_MAX_BYTES
    of payload (`cut`: more follow past the byte bound)."""
    limit = max(1, min(limit, EVENT_PAGE_MAX))
    rows = _rows(uuid.UUID(str(session_id)), after, limit)
    page = Page(LoggedEvent(s, k, json.loads(raw)) for s, k, raw, _ in rows)
    page.cut = rows.cut
    return page


def usage(session: Session) -> dict[str, Any]:
    """Lifetime usage from the running totals kept by the append transaction."""
    return {
        "prompt_tokens": session.prompt_tokens,
        "completion_tokens": session.completion_tokens,
        "cost": float(session.cost) if isinstance(session.cost, Decimal) else session.cost,
        "steps": session.steps,
        "unpriced": session.unpriced_entries,
    }


class Page(list[Any]):
    """A page of a read bounded in count and bytes. `cut`: it stopped at the
    byte bound, so more may follow although it holds fewer than `limit`."""

    cut: bool = False


def read_max_bytes() -> int:
    """TERRET_READ_MAX_BYTES: the most payload one page of events carries."""
    return int(settings.TERRET_READ_MAX_BYTES)


# A fixed statement (prepared on PostgreSQL), so the hub's read on every
# commit hint costs what it did before the byte bound: no ORM compile.
_PAGE_SQL = (
    "SELECT seq, kind, raw, created_at, version FROM ("
    "SELECT seq, kind, CAST(data AS TEXT) AS raw, created_at, version,"
    " SUM(LENGTH(CAST(data AS TEXT))) OVER (ORDER BY seq) - LENGTH(CAST(data AS TEXT)) AS before"
    f" FROM {EVENT_TABLE} WHERE session_id = %s AND seq > %s AND seq <= %s"
    ") w WHERE before < %s ORDER BY seq"
)


def _at(value: Any) -> datetime:
    """created_at as the ORM reads it (SQLite hands back its stored text, in UTC)."""
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


def _rows(session_id: uuid.UUID, after: int, limit: int) -> Page:
    """At most `limit` events after `after`, in seq order, and at most
    read_max_bytes() of their payload (always at least one event: no event
    is larger than TERRET_MAX_EVENT_BYTES). Seqs are dense, so the window
    (after, after + limit] bounds the rows the database looks at; the running
    sum of the payload's length keeps the rows past the bound from being sent
    at all, and the exact byte count trims the last row if needed."""
    budget = read_max_bytes()
    found = backends.current().fetch(_PAGE_SQL, [session_id, after, after + limit, budget])
    page = Page()
    total = 0
    for row in found:
        raw = row["raw"]
        total += len(raw.encode("utf-8", "surrogatepass"))
        if page and total > budget:
            page.cut = True
            break
        # Every door that reads pages (the API, the socket, /lg/'s stream) sees
        # the payload lifted to the catalogue's version; the stored text when current.
        page.append((int(row["seq"]), row["kind"], shown_raw(row["kind"], row["version"], raw), _at(row["created_at"])))
    if total >= budget:
        # Rows past the bound were dropped only when those before them reached it
        # (a character is at least a byte): then more may follow.
        page.cut = True
    return page


def events_page(session_id: uuid.UUID, after: int, limit: int) -> list[dict[str, Any]]:
    """Events with seq > after, in seq order, as API dicts: at most `limit`
    and at most TERRET_READ_MAX_BYTES of payload (the caller pages on)."""
    return [
        {"seq": seq, "kind": kind, "data": json.loads(raw), "at": at.isoformat()}
        for seq, kind, raw, at in _rows(session_id, after, limit)
    ]


def event_frames(session_id: uuid.UUID, after: int, limit: int = PAGE) -> Page:
    """Socket frames of the events with seq > after, bounded like `_rows`
    (`cut` says more follow past the byte bound). Built from the stored
    JSON text without parsing it (the payload is spliced into the frame
    as-is), so a 10k-event replay costs ten page reads and no per-event json
    round trip."""
    rows = _rows(session_id, after, limit)
    page = Page(
        (seq, f'{{"type":"event","seq":{seq},"kind":{json.dumps(kind)},"data":{raw},"at":"{at.isoformat()}"}}')
        for seq, kind, raw, at in rows
    )
    page.cut = rows.cut
    return page


def newest_window(session_id: uuid.UUID, kinds: Any, upto: int | None, limit: int) -> list[tuple[int, str, Any, Any]]:
    """The newest events of `kinds` (at or before `upto`), oldest first: at
    most `limit` of them and at most TERRET_READ_MAX_BYTES of payload, the
    newest kept (always at least one). The sizes are read first, so rows past
    the bound are never sent."""
    qs = Event.objects.filter(session_id=session_id, kind__in=kinds)
    if upto is not None:
        qs = qs.filter(seq__lte=upto)
    sizes = qs.order_by("-seq").annotate(n=Length(Cast("data", TextField()))).values_list("seq", "n")[:limit]
    budget, total, oldest = read_max_bytes(), 0, None
    for seq, n in sizes:
        total += n or 0
        if oldest is not None and total > budget:
            break
        oldest = seq
    if oldest is None:
        return []
    rows = qs.filter(seq__gte=oldest).order_by("seq").values_list("seq", "kind", "data", "created_at", "version")
    return [(seq, kind, lift_shown(kind, version, data), at) for seq, kind, data, at, version in rows]


def rows_before(
    session_id: uuid.UUID, *, before: int | None, upto: int, limit: int
) -> list[tuple[int, str, Any, datetime]]:
    """The `limit` events before `before` (or up to `upto`), oldest first, as
    (seq, kind, data lifted to the catalogue's version, created_at): the chat page's rows."""
    qs = Event.objects.filter(session_id=session_id)
    qs = qs.filter(seq__lt=before) if before is not None else qs.filter(seq__lte=upto)
    rows = list(qs.order_by("-seq").values_list("seq", "kind", "data", "created_at", "version")[:limit])
    rows.reverse()
    return [(seq, kind, lift_shown(kind, version, data), at) for seq, kind, data, at, version in rows]


def more_follow(rows: list[Any], limit: int) -> bool:
    """After a bounded page: may more events follow it? (A full page, or one
    cut at the byte bound.)"""
    return len(rows) >= limit or bool(getattr(rows, "cut", False))
