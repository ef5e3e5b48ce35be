"""Storage tiering: a quiet session's events moved out of the event table
into one compressed segment, and back (docs/storage.md, "Tiering").

A session's log is its events by seq. Cold, the events up to `cold_seq`
sit in a ColdSegment (JSON lines, zlib, the SHA-256 of the uncompressed
bytes), and the event table keeps the session row and the tombstone that
moved them (storage/cold, the next seq). Thawing puts every event back with
its own seq, kind, payload, time and version, checks the checksum first
(a mismatch changes nothing: StorageCorrupt), and logs storage/hot. Seqs
never change, so a reconnect cursor from before the move still works.

Both run inside the caller's log.locked transaction (the session row lock):
writer.locked thaws a cold session before any locked write, and the doors
(actions.session_for) before anything reads its log, so a cold session is
read back lazily, on its first touch, and no caller needs to know.

Where a segment's bytes live is a `SegmentStore`: the database
(`DatabaseStore`, ColdSegment.data) here; an object store would implement
the same three calls and keep its key in ColdSegment.location.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from datetime import datetime
from typing import Any, Protocol

from django.db import connection
from django.utils import timezone

from sessions_app.errors import StorageCorrupt
from sessions_app.log import backends
from sessions_app.log.runs import EVENT_TABLE
from sessions_app.models import ColdSegment, Session

INSERT_BATCH = 500
CODEC = "zlib"


class SegmentStore(Protocol):
    name: str

    def put(self, segment: ColdSegment, blob: bytes) -> None: ...

    def get(self, segment: ColdSegment) -> bytes: ...

    def drop(self, segment: ColdSegment) -> None: ...


class DatabaseStore:
    """The segment's bytes in its own row (the same database, the same transaction)."""

    name = "database"

    def put(self, segment: ColdSegment, blob: bytes) -> None:
        segment.data = blob

    def get(self, segment: ColdSegment) -> bytes:
        return bytes(segment.data)

    def drop(self, segment: ColdSegment) -> None:
        segment.data = b""


STORES: dict[str, SegmentStore] = {"database": DatabaseStore()}


def store() -> SegmentStore:
    return STORES["database"]


def _rows(session_id: Any, through: int) -> list[dict[str, Any]]:
    data = "data::text" if connection.vendor == "postgresql" else "data"
    sql = (
        f"SELECT seq, kind, {data} AS data, created_at, version FROM {EVENT_TABLE} "
        "WHERE session_id = %s AND seq <= %s ORDER BY seq"
    )
    return backends.current().fetch_unprepared(sql, [session_id, through])


def _line(row: dict[str, Any]) -> bytes:
    at = row["created_at"]
    at = at.isoformat() if isinstance(at, datetime) else str(at)
    return json.dumps([row["seq"], row["kind"], row["data"], at, row["version"]], ensure_ascii=False).encode()


def freeze_in(tx: Any, *, by: str) -> ColdSegment | None:
    """Move the session's events (all of them, up to its head) into a
    segment, then log the tombstone. None when it has no events."""
    sid = tx.session_id
    through = int(tx.row["last_seq"])
    rows = _rows(sid, through)
    if not rows:
        return None
    raw = b"\n".join(_line(r) for r in rows)
    blob = zlib.compress(raw, 6)
    segment = ColdSegment(
        session_id=sid,
        first_seq=int(rows[0]["seq"]),
        last_seq=through,
        events=len(rows),
        raw_bytes=len(raw),
        stored_bytes=len(blob),
        sha256=hashlib.sha256(raw).hexdigest(),
        codec=CODEC,
        store=store().name,
    )
    store().put(segment, blob)
    segment.save()
    b = backends.current()
    if connection.vendor == "postgresql":
        # The append-only trigger lets this transaction, and only it, delete (migration 0033).
        b.fetch_unprepared("SET LOCAL terret.tiering = 'on'", [])
    b.fetch_unprepared(f"DELETE FROM {EVENT_TABLE} WHERE session_id = %s AND seq <= %s", [sid, through])
    if connection.vendor == "postgresql":
        b.fetch_unprepared("SET LOCAL terret.tiering = 'off'", [])  # for this DELETE only
    tx.append(
        "storage/cold",
        {
            "through_seq": through,
            "events": segment.events,
            "bytes": segment.raw_bytes,
            "stored_bytes": segment.stored_bytes,
            "sha256": segment.sha256,
            "by": by,
        },
    )
    return segment


def thaw_in(tx: Any, *, by: str) -> int:
    """Put a cold session's events back (checksum first), log storage/hot,
    and refresh tx.row. The number of events restored."""
    sid = tx.session_id
    segments = list(ColdSegment.objects.filter(session_id=sid, deleted_at__isnull=True).order_by("first_seq"))
    lines: list[list[Any]] = []
    for segment in segments:
        raw = zlib.decompress(STORES[segment.store].get(segment))
        if hashlib.sha256(raw).hexdigest() != segment.sha256:
            raise StorageCorrupt(f"session {sid}: cold segment {segment.pk} fails its checksum; nothing was restored")
        lines.extend(json.loads(line) for line in raw.split(b"\n"))
    pg = connection.vendor == "postgresql"
    b = backends.current()
    for start in range(0, len(lines), INSERT_BATCH):
        chunk = lines[start : start + INSERT_BATCH]
        values = ", ".join(["(%s, %s, %s, %s::jsonb, %s, %s)" if pg else "(%s, %s, %s, %s, %s, %s)"] * len(chunk))
        params: list[Any] = []
        for seq, kind, data, at, version in chunk:
            params += [sid, seq, kind, data, datetime.fromisoformat(at) if pg else at, version]
        b.fetch_unprepared(
            f"INSERT INTO {EVENT_TABLE} (session_id, seq, kind, data, created_at, version) VALUES {values}", params
        )
    ColdSegment.objects.filter(pk__in=[s.pk for s in segments]).delete()
    through = max((s.last_seq for s in segments), default=int(tx.row["last_seq"]))
    tx.append("storage/hot", {"through_seq": through, "events": len(lines), "by": by})
    _refresh(tx)
    return len(lines)


def delete_cold_in(tx: Any, *, by: str) -> int:
    """delete_cold_after_days: drop a cold session's segment data for good
    (the rows stay, as the record of what was there), log storage/deleted."""
    segments = list(ColdSegment.objects.filter(session_id=tx.session_id, deleted_at__isnull=True))
    for segment in segments:
        STORES[segment.store].drop(segment)
        segment.deleted_at = timezone.now()
        segment.save(update_fields=["data", "deleted_at"])
    events = sum(s.events for s in segments)
    through = max((s.last_seq for s in segments), default=0)
    tx.append("storage/deleted", {"through_seq": through, "events": events, "by": by})
    return events


def _refresh(tx: Any) -> None:
    """tx.row as the row now is (the thaw's append moved last_seq and the tier)."""
    row = Session.objects.filter(id=tx.session_id).values(*tx.row.keys()).first()
    if row is not None:
        tx.row.update(row)
