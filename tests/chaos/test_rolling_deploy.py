"""The rolling deploy (issue 29, point 5): workers of two releases on one
PostgreSQL and Redis, then the old ones drained with SIGTERM.

"The next release" is this tree started with TERRET_TEST_RELEASE=next
(test-only, honoured under TERRET_TESTING: sessions_app/runtime/codever.py):
it writes step/start at version 2 (an upcaster lifts version 1) and has no
clock.now. The old release is the stack's own workers and daphne, as they
run in every drill. 100 sessions: 70 mid-turn (their first model call held
open until the drain), 10 of them on a profile whose version lists
clock.now (the next release lacks it: those turns block
definition_missing), 20 parked on an approval of debug.charge, 10 with a
schedule due during the drain. The next release's workers and daphne start,
the old workers get SIGTERM, the approvals come in.

Then every session ends, or is blocked with a code; nothing is lost (every
accepted input answered, or held in a blocked turn); the log invariants and
the effects audit hold for every session; each approved charge ran once.
"""

from __future__ import annotations

import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.chaos import harness, invariants
from tests.chaos.harness import Chaos, tool_then_final
from tests.chaos.invariants import Probe
from tests.fakes.fake_llm import Reply
from tests.fakes.planned import Plan
from tests.stack import AppProcess, Stack, _venv_bin

pytestmark = [pytest.mark.chaos]

NEXT = {"TERRET_TESTING": "1", "TERRET_TEST_RELEASE": "next"}
MID_TURN, CLOCK, PARKED, SCHEDULED = 60, 10, 20, 10
CLOCK_PROFILE = "chaos-clock"  # the chaos profile plus clock.now, which the next release drops
BLOCK_CODES = {"definition_missing", "unsupported_version", "retries_exhausted", "context_overflow"}
GATE_TIMEOUT = 90.0
WAKES = 4  # extra drive tasks per follow-up in the overlap, spread over both releases' workers
DUE_IN = 8.0  # the schedules fall due while both releases run or during the drain


def held_then(gate: threading.Event, then: list[tuple[str, dict[str, Any]]]) -> Plan:
    """Step 1's model call waits for `gate` (mid-turn at the drain) and calls
    debug.sleep; each later step calls the next tool of `then`; then "done"."""

    def plan(n: int, body: dict[str, Any]) -> Reply:
        results = sum(1 for m in body.get("messages") or [] if m.get("role") == "tool")
        if results == 0:
            gate.wait(GATE_TIMEOUT)
            return Reply(tool_calls=[("debug.sleep", {"seconds": 0.2})])
        if results - 1 < len(then):
            return Reply(tool_calls=[then[results - 1]])
        return Reply(text="done")

    return plan


def new_session(chaos: Chaos, profile: str) -> str:
    r = chaos._retrying("POST", "/api/sessions", json={"profile": profile})
    assert r.status_code == 201, r.text
    sid = str(r.json()["id"])
    chaos.receipts[sid] = []
    return sid


def start_daphne(stack: Stack, **env: str) -> AppProcess:
    """Replace the stack's daphne by one with `env` (the web tier's deploy), same port."""
    assert stack.daphne is not None
    stack.daphne.stop()
    cmd = [*_venv_bin("daphne"), "-b", "127.0.0.1", "-p", str(stack.http_port), "terret_site.asgi:application"]
    stack.daphne = AppProcess(f"daphne-{env.get('TERRET_TEST_RELEASE', 'old')}", cmd, stack.env(**env), stack.logdir)
    stack.wait_serving()
    return stack.daphne


def blocked_code(chaos: Chaos, sid: str) -> str | None:
    """The code of the open turn's block, None when the session is not blocked."""
    sql = f"SELECT blocked_seq, open_turn_seq FROM {invariants.SESSION_TABLE} WHERE id = %s"
    ((blocked_seq, open_turn_seq),) = invariants.query(chaos.db, sql, [sid])
    if blocked_seq is None or open_turn_seq is None:
        return None
    found = [e for e in chaos.events(sid) if e.kind == "turn/blocked"]
    return str(found[-1].data.get("code")) if found else "?"


def outcome(chaos: Chaos, sid: str, scheduled: bool = False) -> str:
    """ "ended" (settled: no open turn, nothing waiting; a scheduled session
    once its schedule's turn ended), "blocked", or "open"."""
    if invariants.settled(chaos.db, sid) and (not scheduled or chaos.has(sid, "turn/end")):
        return "ended"
    return "blocked" if blocked_code(chaos, sid) is not None else "open"


@pytest.mark.timeout(300)
def test_rolling_deploy_old_workers_drained_by_sigterm(chaos: Chaos) -> None:
    stack = chaos.stack
    old = chaos.ensure_workers(2)
    gate = threading.Event()
    t0 = time.monotonic()
    groups: dict[str, list[str]] = {"mid_turn": [], "clock": [], "parked": [], "scheduled": []}
    fields = harness.PROFILE_FIELDS
    stack.create_profile(CLOCK_PROFILE, **{**fields, "builtin_tools": [*fields["builtin_tools"], "clock.now"]})
    for i in range(MID_TURN + CLOCK):
        sid = chaos.new_session() if i >= CLOCK else new_session(chaos, CLOCK_PROFILE)
        then: list[tuple[str, dict[str, Any]]] = [("clock.now", {})] if i < CLOCK else []
        groups["clock" if i < CLOCK else "mid_turn"].append(sid)
        chaos.post(sid, f"deploy {i} {time.monotonic_ns()}", held_then(gate, then))
    for i in range(PARKED):
        sid = chaos.new_session()
        groups["parked"].append(sid)
        chaos.post(sid, f"parked {i} {time.monotonic_ns()}", tool_then_final(("debug.charge", {"seconds": 0})))
    for sid in groups["parked"]:
        chaos.wait_kind(sid, "approval/requested", timeout=60)
    sessions = [sid for group in groups.values() for sid in group]
    try:
        _drill(chaos, old, groups, sessions, gate, t0)
    finally:
        gate.set()
        for w in chaos.alive():
            if w not in old and "TERRET_TEST_RELEASE" in w.name:
                w.stop(30)
        start_daphne(stack)


def _drill(
    chaos: Chaos, old: list[AppProcess], groups: dict[str, list[str]], sessions: list[str], gate: threading.Event,
    t0: float,
) -> None:  # fmt: skip
    stack = chaos.stack
    due = (datetime.now(UTC) + timedelta(seconds=DUE_IN)).isoformat()
    for i in range(SCHEDULED):
        sid = chaos.new_session()
        groups["scheduled"].append(sid)
        sessions.append(sid)
        r = chaos._retrying("POST", f"/api/sessions/{sid}/schedules", json={"due_at": due, "text": f"due {i}"})
        assert r.status_code == 201, r.text
    # The next release: two workers and the web tier, alongside the old workers.
    new = [_next_worker(stack, i) for i in range(2)]
    for w in new:
        stack.wait_worker_ready(w, 90)
    start_daphne(stack, **NEXT)
    overlap(chaos, groups["parked"][: PARKED // 2])
    open_at_drain = {sid for sid in sessions if invariants.session_row(chaos.db, sid)["open_turn_seq"] is not None}
    drained_at = time.time()
    for w in old:
        chaos.signal(w, signal.SIGTERM)
    time.sleep(0.5)
    gate.set()  # the held model calls answer: the old workers finish their step and hand the turn over
    for sid in groups["parked"][PARKED // 2 :]:
        call_id = next(e for e in chaos.events(sid) if e.kind == "approval/requested").data["call_id"]
        chaos.approve(sid, call_id)
    codes = [w.proc.wait(60) for w in old]
    exited_s = time.time() - drained_at
    left = sum(w.output().count("left to one that does") for w in old)

    deadline = time.monotonic() + 120
    outcomes: dict[str, str] = {}
    while time.monotonic() < deadline:
        outcomes = {sid: outcome(chaos, sid, sid in groups["scheduled"]) for sid in sessions}
        if "open" not in outcomes.values():
            break
        time.sleep(1.0)
    ended = [s for s, o in outcomes.items() if o == "ended"]
    blocked = {s: blocked_code(chaos, s) for s, o in outcomes.items() if o == "blocked"}
    lost = [s for s, o in outcomes.items() if o == "open"]
    handed_over = [s for s in ended if s in open_at_drain and _ended_after(chaos, s, drained_at)]

    probe = Probe(stack.env(TERRET_DB_POOL_MAX=0, **NEXT), stack.logdir / "probe-next.log")
    try:
        report = invariants.check_round(chaos.db, probe, {s: chaos.receipts.get(s, []) for s in ended})
        problems = _blocked_problems(chaos, probe, blocked)
    finally:
        probe.close()
    charges = [harness.charges(stack, s) for s in groups["parked"]]
    sql = f"SELECT version, count(*) FROM {invariants.EVENT_TABLE} WHERE kind = 'step/start' GROUP BY version"
    step_starts = {int(v): int(n) for v, n in invariants.query(chaos.db, sql, [])}
    harness.summary(
        "rolling deploy", sessions=len(sessions), open_at_drain=len(open_at_drain), handed_over=len(handed_over),
        ended=len(ended), blocked=len(blocked),
        blocked_codes=",".join(sorted({str(c) for c in blocked.values()})) or "-", lost=len(lost),
        old_exit_codes=",".join(map(str, codes)), old_exited_after_s=exited_s, left_to_newer=left,
        turns=report.turns, effects=report.effects, step_start_by_version=step_starts, charges=sum(charges),
        wall_s=time.monotonic() - t0,
    )  # fmt: skip
    assert not lost, f"sessions neither ended nor blocked: {lost}\n{stack.logs()}"
    assert codes == [0, 0], "the old workers drain and exit 0"
    assert not problems, "\n".join(problems)
    assert set(blocked.values()) <= BLOCK_CODES
    assert charges == [1] * PARKED, f"each approved charge ran once: {charges}"
    for i, sid in enumerate(groups["scheduled"]):
        texts = [str(e.data.get("text")) for e in chaos.events(sid) if e.kind == "user/message"]
        assert any(f"due {i}" in t for t in texts), f"the due schedule of {sid} ran: {texts}"
    assert handed_over, "some turn open at the drain was finished by the next release"
    assert step_starts.get(1) and step_starts.get(2), "both releases wrote step/start, each at its own version"
    assert {blocked_code(chaos, s) for s in groups["clock"]} <= {"definition_missing", None}


def overlap(chaos: Chaos, parked: list[str]) -> None:
    """While both releases run: approve `parked`, and once each turn ended
    post a follow-up with extra wake-ups, so old workers meet logs the next
    release wrote at version 2 (they leave them, codever.py)."""
    for sid in parked:
        chaos.approve(sid, next(e for e in chaos.events(sid) if e.kind == "approval/requested").data["call_id"])
    for sid in parked:
        chaos.wait_kind(sid, "turn/end", timeout=60)
        chaos.post(sid, f"after the approval {sid}")
        chaos.probe.wake(sid, WAKES)


def _next_worker(stack: Stack, i: int) -> AppProcess:
    """A worker of the next release (TERRET_TEST_RELEASE=next), as `make dist` starts one."""
    cmd = [
        *_venv_bin("celery"), "-A", "terret_site", "worker", "--pool", "threads", "--concurrency",
        str(stack.concurrency), "-Q", "terret", "-n", f"next{i}-{time.monotonic_ns()}@%h", "--loglevel", "INFO",
    ]  # fmt: skip
    worker = AppProcess(f"worker-next{i}-TERRET_TEST_RELEASE", cmd, stack.env(**NEXT), stack.logdir)
    stack.workers.append(worker)
    return worker


def _ended_after(chaos: Chaos, sid: str, moment: float) -> bool:
    return any(e.kind == "turn/end" and e.at > moment for e in chaos.events(sid))


def _blocked_problems(chaos: Chaos, probe: Probe, blocked: dict[str, str | None]) -> list[str]:
    """A blocked session: its log holds (the open turn allowed), the effects
    audit holds, and every accepted input is in the log (pending in view)."""
    problems: list[str] = []
    for sid, code in blocked.items():
        events = chaos.events(sid)
        found = invariants.log_problems(events, allow_open=True)
        found += [f"effect audit: {p}" for p in probe.audit(sid)["problems"]]
        seqs = {e.seq for e in events}
        found += [
            f"input {r.get('seq')} not in the log" for r in chaos.receipts.get(sid, []) if r.get("seq") not in seqs
        ]
        problems += [f"session {sid} (blocked {code}): {p}" for p in found]
    return problems
