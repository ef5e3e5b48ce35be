"""The session log: the only way into it, and the reads and fan-out around it.

Writing (nothing else inserts events; the ORM refuses to change or delete
one, and on PostgreSQL a trigger refuses UPDATE and DELETE from any client):

- `append(session_id, kind, data, *, fence=None)` appends one event and
  returns it (an `AppendedEvent` with its seq).
- `append_many(session_id, [(kind, data), ...], *, fence=None, guard=None,
  release=False)` appends several events atomically, in order, on
  consecutive seqs, and returns them (`Appended`, a list). With `guard` (a
  key of `GUARDS`, or `(key, value)`) the batch is written only while the
  session row meets the condition, decided by the append's own row lock: a
  check-then-act in one statement; an empty list means it did not, and
  nothing was written. With `release` the same commit also gives up the
  lease `fence` holds, and `.workload` is the session's workload as left.
- `locked(session_id, *, fence=None)` opens a transaction holding the
  session's row lock for a decision and the appends it leads to
  (admission, verdicts, compaction boundaries); `tx.row` is the row as
  locked and `tx.append(kind, data)` appends under it. Nothing external
  (model calls, group sends, task dispatch) belongs inside.

At most one turn is open: a run holding `turn/start` is written only while
the session row has no open turn (`open_turn_seq`), decided by the write's
own row lock in the same statement. A guarded batch that finds a turn open
writes nothing (an empty list, as for its guard); any other write raises
`TurnAlreadyOpen`, whether through `append_many`, `append` or `tx.append`.
The caller then queues behind the open turn.

`refusal(kind, data)` says why a write would be refused (None: it would
not be), writing nothing: for code that must keep what it can of a batch.

Every write validates each payload against its kind's schema (`catalogue`)
before anything is written (`UnknownEventKind`, `InvalidPayload`), takes
the session's row lock, assigns the next seqs, inserts the events, updates
the session's projection columns in the same statement or transaction, and
hands the events to the fan-out after commit. A `fence` re-checks the
lease generation under that lock (`LeaseLost` if superseded) and extends
the lease; a missing session is `SessionNotFound`. On PostgreSQL, outside a
transaction, a write whose events fit one run (runs.py: no projection
column twice, at most one extra write; nearly every batch) is one autocommit
statement: one round trip.

After commit, `on_event` listeners receive each event in seq order per
session (fanout.py), and a hint goes to the session's channel-layer group
(hints.py). Reads are in `reads`, the model's view in `projection`.
"""

from __future__ import annotations

from sessions_app.errors import InvalidPayload, LeaseLost, SessionNotFound, TurnAlreadyOpen, UnknownEventKind
from sessions_app.log.fanout import on_event
from sessions_app.log.records import AppendedEvent, Fence, LoggedEvent, Workload
from sessions_app.log.runs import GUARDS, Guard
from sessions_app.log.writer import Appended, SessionTx, append, append_many, locked, refusal

__all__ = [
    "GUARDS",
    "Appended",
    "AppendedEvent",
    "Fence",
    "Guard",
    "InvalidPayload",
    "LeaseLost",
    "LoggedEvent",
    "SessionNotFound",
    "SessionTx",
    "TurnAlreadyOpen",
    "UnknownEventKind",
    "Workload",
    "append",
    "append_many",
    "locked",
    "on_event",
    "refusal",
]
