"""What must hold after every round of every chaos drill (docs/chaos.md).

A round ends when its sessions have settled (no open turn, no input waiting
to be taken in); then `check_round` reads each session's whole log straight
from the private stack's database and asserts:

- the log invariants (`log_problems`): seqs gapless from 1; turn/start and
  turn/end alternate, one end per start; a closed turn owes no tool result
  for any call its assistant messages made, and has no result for a call it
  never made, nor two for one; a step ends at most once per turn; every
  approval verdict lies inside the turn that asked, answers a request of
  that turn, once;
- the effect audit (`sessions_app.runtime.effects.effects_audit`) and the
  task audit beside it (`sessions_app.runtime.owned.audit.tasks_audit`), run by a
  `Probe`: a Django process of the stack's own settings, kept alive for the
  whole pass so a round's audit costs milliseconds, not a process start;
- that every input the API accepted (its 202 receipt) was taken into a turn
  that ended (`input_problems`), or is held visibly (an `input/held` names
  it or an earlier held input), or was withdrawn.

`python -m tests.chaos.invariants` is the probe's side: JSON lines on stdin
(`{"op": "audit", "sid": ...}`, `{"op": "wake", "sid": ..., "times": n}`:
the project's own `send_drive`, for the duplicate-delivery drill), one JSON
line per request on stdout, prefixed with `PROBE `.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EVENT_TABLE = "sessions_app_event"
SESSION_TABLE = "sessions_app_session"
PREFIX = "PROBE "
# Kinds whose payload names the input/queued they took in.
TAKES_INPUT = ("user/message", "context/injected")


@dataclass(frozen=True)
class Ev:
    seq: int
    kind: str
    data: dict[str, Any]
    at: float  # created_at, epoch seconds


@dataclass
class Turn:
    start: int
    end: int | None = None
    events: list[Ev] = field(default_factory=list)


# -- reading the private database ---------------------------------------------------


def read_events(db_url: str, sid: str, timeout: float = 60.0) -> list[Ev]:
    """The session's whole log, in seq order; retried while the database is away."""
    sql = (
        f"SELECT seq, kind, data, extract(epoch FROM created_at) FROM {EVENT_TABLE} WHERE session_id = %s ORDER BY seq"
    )
    rows = query(db_url, sql, [sid], timeout)
    return [Ev(int(seq), kind, data or {}, float(at)) for seq, kind, data, at in rows]


def session_row(db_url: str, sid: str, timeout: float = 60.0) -> dict[str, Any]:
    cols = (
        "open_turn_seq",
        "inbox_seq",
        "last_input_seq",
        "held_seq",
        "lease_owner",
        "pending_approvals",
        "queued_follow_ups",
    )
    rows = query(db_url, f"SELECT {', '.join(cols)} FROM {SESSION_TABLE} WHERE id = %s", [sid], timeout)
    if not rows:
        raise AssertionError(f"no session {sid}")
    return dict(zip(cols, rows[0], strict=True))


def query(db_url: str, sql: str, params: list[Any], timeout: float = 60.0) -> list[tuple[Any, ...]]:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(db_url, connect_timeout=2, autocommit=True) as conn:
                return list(conn.execute(sql, params).fetchall())
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def settled(db_url: str, sid: str) -> bool:
    """No open turn and no input waiting to be taken in: no steer, no
    follow-up owed a turn (held input counts as settled: it is visible)."""
    row = session_row(db_url, sid)
    pending = row["last_input_seq"] > row["inbox_seq"] or row["queued_follow_ups"] > 0
    waiting = pending and row["held_seq"] is None
    return row["open_turn_seq"] is None and not waiting


# -- the log invariants ------------------------------------------------------------------


def turns_of(events: list[Ev]) -> tuple[list[Turn], list[str]]:
    """The turns, each with the events between its turn/start and turn/end; and pairing problems."""
    turns: list[Turn] = []
    problems: list[str] = []
    current: Turn | None = None
    for ev in events:
        if ev.kind == "turn/start":
            if current is not None:
                problems.append(f"turn/start at {ev.seq} while the turn of {current.start} is open")
            current = Turn(ev.seq)
            turns.append(current)
        elif ev.kind == "turn/end":
            if current is None:
                problems.append(f"turn/end at {ev.seq} with no open turn")
                continue
            current.end = ev.seq
            current = None
        elif current is not None:
            current.events.append(ev)
    return turns, problems


def log_problems(events: list[Ev], *, allow_open: bool = False) -> list[str]:
    seqs = [e.seq for e in events]
    problems = [] if seqs == list(range(1, len(seqs) + 1)) else [f"seqs are not gapless from 1: {seqs}"]
    turns, pairing = turns_of(events)
    problems += pairing
    for turn in turns:
        if turn.end is None:
            if not allow_open:
                problems.append(f"the turn of {turn.start} never ended")
            continue
        problems += _tool_problems(turn) + _step_problems(turn) + _verdict_problems(turn)
    problems += _stray_verdicts(events, turns)
    return problems


def _tool_problems(turn: Turn) -> list[str]:
    calls = [c["id"] for e in turn.events if e.kind == "assistant/message" for c in e.data.get("tool_calls") or []]
    results = [e.data["call_id"] for e in turn.events if e.kind == "tool/result"]
    problems = [f"turn {turn.start} closed owing a result for {c}" for c in calls if c not in results]
    problems += [f"turn {turn.start}: a result for {c}, which it never called" for c in results if c not in calls]
    problems += [f"turn {turn.start}: {c} has {results.count(c)} results" for c in set(results) if results.count(c) > 1]
    return problems


def _step_problems(turn: Turn) -> list[str]:
    ends = [e.data["step"] for e in turn.events if e.kind == "step/end"]
    return [f"turn {turn.start}: step {s} ended {ends.count(s)} times" for s in set(ends) if ends.count(s) > 1]


def _verdict_problems(turn: Turn) -> list[str]:
    problems: list[str] = []
    asked: set[str] = set()
    answered: set[str] = set()
    for e in turn.events:
        if e.kind == "approval/requested":
            asked.add(e.data["call_id"])
            answered.discard(e.data["call_id"])  # asked again (after approval/voided): a new verdict is due
        elif e.kind == "approval/resolved":
            call = e.data["call_id"]
            if call not in asked:
                problems.append(f"turn {turn.start}: verdict at {e.seq} for {call}, never asked in this turn")
            if call in answered:
                problems.append(f"turn {turn.start}: a second verdict at {e.seq} for {call}")
            answered.add(call)
    return problems


def _stray_verdicts(events: list[Ev], turns: list[Turn]) -> list[str]:
    inside = {e.seq for t in turns for e in t.events}
    return [
        f"verdict at {e.seq} outside any turn" for e in events if e.kind == "approval/resolved" and e.seq not in inside
    ]


# -- accepted input ------------------------------------------------------------------------


def input_problems(events: list[Ev], receipts: Iterable[dict[str, Any]]) -> list[str]:
    """Every accepted input ended in a turn/end, is held visibly, or was withdrawn."""
    turns, _ = turns_of(events)
    ended = {t.start: t for t in turns if t.end is not None}
    taken: dict[int, int] = {}  # input/queued seq -> the turn (start seq) that took it in
    for t in turns:
        for e in t.events:
            if e.kind in TAKES_INPUT and e.data.get("source_seq"):
                taken[int(e.data["source_seq"])] = t.start
    held = [int(e.data["source_seq"]) for e in events if e.kind == "input/held"]
    withdrawn = {int(e.data["source_seq"]) for e in events if "withdraw" in e.kind and e.data.get("source_seq")}
    problems = []
    for r in receipts:
        seq, how = int(r["seq"]), r["disposition"]
        if how == "started":
            if r["turn_seq"] not in ended:
                problems.append(f"input {seq} started the turn of {r['turn_seq']}, which has not ended")
        elif seq in taken:
            if taken[seq] not in ended:
                problems.append(f"input {seq} ({how}) was taken into the turn of {taken[seq]}, which has not ended")
        elif seq in withdrawn or any(h <= seq for h in held):
            continue
        else:
            problems.append(f"input {seq} ({how}) was never taken in, held or withdrawn")
    return problems


# -- lanes and receipts ----------------------------------------------------------------------


def lane_problems(events: list[Ev]) -> list[str]:
    """Every follow-up opens a turn of its own, in arrival order
    (docs/protocol.md, "Lanes"): its input/deferred is placed by the
    user/message of a turn that takes in no other follow-up, never as
    context, and follow-ups' turns open in the order they arrived."""
    follow_ups = [e.seq for e in events if e.kind == "input/deferred" and e.data.get("lane") == "follow_up"]
    turns, _ = turns_of(events)
    problems: list[str] = []
    order: list[int] = []
    for turn in turns:
        placed = [e for e in turn.events if e.kind in TAKES_INPUT and e.data.get("source_seq") in follow_ups]
        problems += [
            f"follow-up {e.data['source_seq']} folded into the turn of {turn.start} as context"
            for e in placed
            if e.kind != "user/message"
        ]
        if len(placed) > 1:
            problems.append(f"the turn of {turn.start} took in {len(placed)} follow-ups")
        order += [int(e.data["source_seq"]) for e in placed]
    if order != sorted(order):
        problems.append(f"follow-ups' turns opened out of arrival order: {order}")
    return problems


def receipt_problems(events: list[Ev], receipts: Iterable[dict[str, Any]]) -> list[str]:
    """Each receipt's disposition is true of the log (receipts as read back,
    GET …/inputs/{seq}): `answered` by the end of the very turn that placed
    it, `placed` in a turn still open, `queued` not yet taken in, `withdrawn`
    taken back, `started` the user/message of the turn it names."""
    turns, _ = turns_of(events)
    by_seq = {e.seq: e for e in events}
    problems: list[str] = []
    for r in receipts:
        seq, how = int(r["seq"]), r["disposition"]
        placed = _placement(events, seq)
        turn = _turn_holding(turns, placed) if placed is not None else None
        if how == "started":
            ok = turn is not None and turn.start == r["turn_seq"] and placed == seq
        elif how == "answered":
            ok = turn is not None and (turn.start, turn.end, placed) == (
                r["turn_seq"],
                r.get("answered_seq"),
                r.get("placed_seq"),
            )
        elif how == "placed":
            ok = turn is not None and turn.end is None and turn.start == r["turn_seq"]
        elif how == "withdrawn":
            ok = any(e.kind == "input/withdrawn" and e.data.get("source_seq") == seq for e in events)
        else:  # queued or held: nothing took it in yet
            ok = placed is None and seq in by_seq
        if not ok:
            where = f"turn {turn.start}..{turn.end}" if turn is not None else "no turn"
            problems.append(f"input {seq}: receipt says {how} ({r}), the log says placed at {placed} in {where}")
    return problems


def _placement(events: list[Ev], seq: int) -> int | None:
    """Where input `seq` entered the transcript: itself (a user/message that
    opened its turn), or the user/message or context/injected naming it."""
    for e in events:
        if e.seq == seq and e.kind == "user/message" and "source_seq" not in e.data:
            return seq
        if e.kind in TAKES_INPUT and e.data.get("source_seq") == seq:
            return e.seq
    return None


def _turn_holding(turns: list[Turn], seq: int) -> Turn | None:
    return next((t for t in turns if t.start < seq and (t.end is None or seq < t.end)), None)


# -- the probe: effects_audit (and wake-ups) inside the stack's own Django -------------------


class Probe:
    """A long-lived `python -m tests.chaos.invariants` on the stack's settings."""

    def __init__(self, env: dict[str, str], logfile: Path) -> None:
        self._log = open(logfile, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.invariants"],
            cwd=ROOT,
            env={**env, "DJANGO_SETTINGS_MODULE": "terret_site.settings"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()

    def call(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the probe exited ({self.proc.poll()}); see {self._log.name}")
                if line.startswith(PREFIX):
                    answer: dict[str, Any] = json.loads(line[len(PREFIX) :])
                    if "error" in answer:
                        raise RuntimeError(f"probe {request}: {answer['error']}")
                    return answer

    def audit(self, sid: str) -> dict[str, Any]:
        return self.call(op="audit", sid=sid)

    def wake(self, sid: str, times: int) -> int:
        return int(self.call(op="wake", sid=sid, times=times)["sent"])

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


# -- one round's checks ------------------------------------------------------------------------


@dataclass
class RoundReport:
    sessions: int = 0
    turns: int = 0
    steps: int = 0
    events: int = 0
    effects: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)  # tasks_audit's counts: by phase, and "tasks"


def check_round(db_url: str, probe: Probe, receipts: dict[str, list[dict[str, Any]]]) -> RoundReport:
    """All three checks on every session of the round (sid -> its accepted receipts)."""
    report = RoundReport()
    failures: list[str] = []
    for sid, accepted in receipts.items():
        events = read_events(db_url, sid)
        audit = probe.audit(sid)
        problems = log_problems(events) + input_problems(events, accepted)
        problems += [f"effect audit: {p}" for p in audit["problems"]]
        if problems:
            kinds = " ".join(f"{e.seq}:{e.kind}" for e in events)
            failures.append(f"session {sid}:\n  " + "\n  ".join(problems) + f"\n  log: {kinds}")
        report.sessions += 1
        report.turns += sum(e.kind == "turn/end" for e in events)
        report.steps += sum(e.kind == "step/end" for e in events)
        report.events += len(events)
        for state, n in audit["counts"].items():
            report.effects[state] = report.effects.get(state, 0) + n
        for phase, n in audit.get("tasks", {}).items():
            report.tasks[phase] = report.tasks.get(phase, 0) + n
    assert not failures, "invariants broken:\n" + "\n".join(failures)
    return report


# -- the probe process's side -------------------------------------------------------------------


def _serve() -> None:
    import django

    django.setup()
    from django.db import connection, utils

    from sessions_app.runtime.dispatch import send_drive
    from sessions_app.runtime.effects import effects_audit
    from sessions_app.runtime.owned.audit import tasks_audit

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "wake":
            for _ in range(int(request["times"])):
                send_drive(request["sid"])
            return {"sent": int(request["times"])}
        audit, tasks = effects_audit(request["sid"]), tasks_audit(request["sid"])
        # tasks_audit beside effects_audit: every owned task in exactly one state (runtime/owned/audit.py).
        problems = list(audit.problems) + [f"tasks_audit: {p}" for p in tasks.problems]
        return {
            "ok": audit.ok and tasks.ok,
            "counts": dict(audit.counts),
            "tasks": dict(tasks.counts),
            "problems": problems,
        }

    for line in sys.stdin:
        request = json.loads(line)
        deadline = time.monotonic() + 60
        while True:
            try:
                out = answer(request)
                break
            except utils.Error as exc:  # the database restarted under us: a fresh connection
                connection.close()
                if time.monotonic() > deadline:
                    out = {"error": repr(exc)}
                    break
                time.sleep(0.2)
            except Exception as exc:
                out = {"error": repr(exc)}
                break
        sys.stdout.write(PREFIX + json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "terret_site.settings")
    _serve()
