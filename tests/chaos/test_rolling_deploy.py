"""The rolling deploy (issue 29, point 5): workers of two releases, two
real code trees, on one PostgreSQL and Redis; then the old ones drained
with SIGTERM.

The new release is this checkout (the stack's own tree): session/upgraded
at event version 2 ({number, digest}, its upcaster lifting version 1), and
no clock.today. The previous release is a detached git worktree of HEAD
with a patch taking both back (tests/chaos/releases.py): it writes
session/upgraded at version 1 and has clock.today. Its daphne and two
workers run from that tree (their own working directory and sys.path).

100 sessions: 55 mid-turn (their first model call held open until the
drain), 10 of them on a profile whose version lists clock.today (the new
release lacks it: those turns block definition_missing), 20 parked on an
approval of debug.charge, 10 with a schedule due during the drain, and 5
moved to a new agent version by the old release (session/upgraded at
version 1), then again by the new one (at version 2). The new release's
workers and daphne start, the old workers get SIGTERM, the approvals come
in.

Then every session ends, or is blocked with a code; nothing is lost (every
accepted input answered, or held in a blocked turn); the log invariants and
the effects audit hold for every session; each approved charge ran once;
the new release reads the old release's session/upgraded lifted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import harness, invariants
from tests.chaos.harness import PROFILE, Chaos, tool_then_final
from tests.chaos.invariants import Probe
from tests.chaos.releases import DROPPED_TOOL, Release, build_previous
from tests.fakes.fake_llm import Reply
from tests.fakes.planned import Plan
from tests.stack import ROOT, AppProcess, Stack, _venv_bin

pytestmark = [pytest.mark.chaos]

MID_TURN, CLOCK, PARKED, SCHEDULED, UPGRADED = 55, 10, 20, 10, 5
CLOCK_PROFILE = "chaos-today"  # the chaos profile plus clock.today, which the new release dropped
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


def start_daphne(stack: Stack, release: Release | None = None) -> AppProcess:
    """Replace the stack's daphne by one of `release` (None: the new, the
    stack's own tree): the web tier's deploy, same port."""
    assert stack.daphne is not None
    stack.daphne.stop()
    cmd = [*_venv_bin("daphne"), "-b", "127.0.0.1", "-p", str(stack.http_port), "terret_site.asgi:application"]
    name = "daphne-previous" if release else "daphne"
    stack.daphne = AppProcess(name, cmd, release_env(stack, release), stack.logdir, cwd=tree(release))
    stack.wait_serving()
    return stack.daphne


def tree(release: Release | None) -> Path:
    return release.root if release else ROOT


def release_env(stack: Stack, release: Release | None, **extra: str) -> dict[str, str]:
    """The stack's environment for a process of `release`: its tree first on sys.path, its build named."""
    if release is None:
        return stack.env(**extra)
    return stack.env(PYTHONPATH=str(release.root), TERRET_BUILD=f"{release.commit}-previous", **extra)


def manage_in(stack: Stack, release: Release | None, code: str) -> None:
    """`manage.py shell -c code` with `release`'s code (an admin's edit through that release)."""
    cmd = [sys.executable, "manage.py", "shell", "-c", code]
    done = subprocess.run(
        cmd, cwd=tree(release), env=release_env(stack, release), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"manage.py shell failed:\n{done.stdout}\n{done.stderr}"


def edit_profile(stack: Stack, release: Release | None, name: str, prompt: str) -> None:
    """An admin's edit of the profile: save() makes a new agent version."""
    manage_in(stack, release, (
        "from sessions_app.models import AgentProfile; "
        f"p = AgentProfile.objects.get(name={name!r}); p.system_prompt = {prompt!r}; p.save()"
    ))  # fmt: skip


def start_worker(stack: Stack, release: Release | None, i: int) -> AppProcess:
    """A worker of `release` (None: the new), as `make dist` starts one."""
    label = "previous" if release else "new"
    cmd = [
        *_venv_bin("celery"), "-A", "terret_site", "worker", "--pool", "threads", "--concurrency",
        str(stack.concurrency), "-Q", "terret", "-n", f"{label}{i}-{time.monotonic_ns()}@%h", "--loglevel", "INFO",
    ]  # fmt: skip
    worker = AppProcess(f"worker-{label}{i}", cmd, release_env(stack, release), stack.logdir, cwd=tree(release))
    stack.workers.append(worker)
    return worker


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
    t0 = time.monotonic()
    previous = build_previous(stack.root / f"previous-release-{time.monotonic_ns()}")
    gate = threading.Event()
    old: list[AppProcess] = []
    try:
        # The previous release serves and works alone: the stack's own workers go first.
        for w in chaos.alive():
            w.stop(30)
        start_daphne(stack, previous)
        old = [start_worker(stack, previous, i) for i in range(2)]
        for w in old:
            stack.wait_worker_ready(w, 90)
        groups = _start_sessions(chaos, previous, gate)
        sessions = [sid for group in groups.values() for sid in group]
        _drill(chaos, previous, old, groups, sessions, gate, t0)
    finally:
        gate.set()
        for w in old:
            w.stop(30)
        if stack.daphne is not None and stack.daphne.name != "daphne":
            start_daphne(stack)
        previous.remove()


def _start_sessions(chaos: Chaos, previous: Release, gate: threading.Event) -> dict[str, list[str]]:
    """The sessions the previous release has going when the deploy starts."""
    stack = chaos.stack
    groups: dict[str, list[str]] = {"mid_turn": [], "clock": [], "parked": [], "scheduled": [], "upgraded": []}
    fields = {**harness.PROFILE_FIELDS, "builtin_tools": [*harness.PROFILE_FIELDS["builtin_tools"], DROPPED_TOOL]}
    # Through the previous release's code: the new one has no clock.today to describe in the version.
    manage_in(stack, previous, (
        "import json; from sessions_app.models import AgentProfile; "
        f"AgentProfile.objects.create(**json.loads({json.dumps({'name': CLOCK_PROFILE, **fields})!r}))"
    ))  # fmt: skip
    for i in range(UPGRADED):
        sid = chaos.new_session()
        groups["upgraded"].append(sid)
        chaos.post(sid, f"before the edit {i} {time.monotonic_ns()}", tool_then_final(("debug.noop", {})))
    for sid in groups["upgraded"]:
        chaos.wait_kind(sid, "turn/end", timeout=60)
    edit_profile(stack, previous, PROFILE, "version two, saved under the previous release")
    for i, sid in enumerate(groups["upgraded"]):
        chaos.post(sid, f"after the edit {i} {time.monotonic_ns()}", tool_then_final(("debug.noop", {})))
    for sid in groups["upgraded"]:
        chaos.wait_kind(sid, "turn/end", count=2, timeout=60)  # it opened with session/upgraded, at version 1
    for i in range(MID_TURN + CLOCK):
        sid = chaos.new_session() if i >= CLOCK else new_session(chaos, CLOCK_PROFILE)
        then: list[tuple[str, dict[str, Any]]] = [(DROPPED_TOOL, {})] if i < CLOCK else []
        groups["clock" if i < CLOCK else "mid_turn"].append(sid)
        chaos.post(sid, f"deploy {i} {time.monotonic_ns()}", held_then(gate, then))
    for i in range(PARKED):
        sid = chaos.new_session()
        groups["parked"].append(sid)
        chaos.post(sid, f"parked {i} {time.monotonic_ns()}", tool_then_final(("debug.charge", {"seconds": 0})))
    for sid in groups["parked"]:
        chaos.wait_kind(sid, "approval/requested", timeout=60)
    return groups


def _drill(
    chaos: Chaos, previous: Release, old: list[AppProcess], groups: dict[str, list[str]], sessions: list[str],
    gate: threading.Event, t0: float,
) -> None:  # fmt: skip
    stack = chaos.stack
    due = (datetime.now(UTC) + timedelta(seconds=DUE_IN)).isoformat()
    for i in range(SCHEDULED):
        sid = chaos.new_session()
        groups["scheduled"].append(sid)
        sessions.append(sid)
        r = chaos._retrying("POST", f"/api/sessions/{sid}/schedules", json={"due_at": due, "text": f"due {i}"})
        assert r.status_code == 201, r.text
    # The new release: two workers and the web tier, alongside the old workers.
    new = [start_worker(stack, None, i) for i in range(2)]
    for w in new:
        stack.wait_worker_ready(w, 90)
    start_daphne(stack)
    edit_profile(stack, None, PROFILE, "version three, saved under the new release")
    for i, sid in enumerate(groups["upgraded"]):
        chaos.post(sid, f"after the deploy {i} {time.monotonic_ns()}", tool_then_final(("debug.noop", {})))
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

    probe = Probe(stack.env(TERRET_DB_POOL_MAX=0), stack.logdir / "probe-new.log")
    try:
        report = invariants.check_round(chaos.db, probe, {s: chaos.receipts.get(s, []) for s in ended})
        problems = _blocked_problems(chaos, probe, blocked)
    finally:
        probe.close()
    charges = [harness.charges(stack, s) for s in groups["parked"]]
    sql = f"SELECT version, count(*) FROM {invariants.EVENT_TABLE} WHERE kind = 'session/upgraded' GROUP BY version"
    upgraded = {int(v): int(n) for v, n in invariants.query(chaos.db, sql, [])}
    harness.summary(
        "rolling deploy", previous=previous.how, sessions=len(sessions), open_at_drain=len(open_at_drain),
        handed_over=len(handed_over), ended=len(ended), blocked=len(blocked),
        blocked_codes=",".join(sorted({str(c) for c in blocked.values()})) or "-", lost=len(lost),
        old_exit_codes=",".join(map(str, codes)), old_exited_after_s=exited_s, left_to_newer=left,
        turns=report.turns, effects=report.effects, upgraded_by_version=upgraded, charges=sum(charges),
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
    assert handed_over, "some turn open at the drain was finished by the new release"
    assert upgraded.get(1) and upgraded.get(2), "each release wrote session/upgraded at its own version"
    assert {blocked_code(chaos, s) for s in groups["clock"]} <= {"definition_missing", None}
    _read_lifted(chaos, groups["upgraded"])


def _read_lifted(chaos: Chaos, sids: list[str]) -> None:
    """The new release's API shows each session's session/upgraded lifted:
    the previous release's (version 1 in the database) with the digest it
    never recorded as null, its own with the digests."""
    for sid in sids:
        stored = [int(v) for (v,) in invariants.query(
            chaos.db, f"SELECT version FROM {invariants.EVENT_TABLE} WHERE session_id = %s AND kind = %s ORDER BY seq",
            [sid, "session/upgraded"],
        )]  # fmt: skip
        assert stored == [1, 2], f"{sid}: session/upgraded stored at versions {stored}"
        r = chaos._retrying("GET", f"/api/sessions/{sid}/events", params={"after": 0, "limit": 1000})
        assert r.status_code == 200, r.text
        moves = [e["data"] for e in r.json()["events"] if e["kind"] == "session/upgraded"]
        assert [(m["from"]["number"], m["to"]["number"]) for m in moves] == [(1, 2), (2, 3)]
        assert moves[0]["to"]["digest"] is None and moves[1]["to"]["digest"], moves


def overlap(chaos: Chaos, parked: list[str]) -> None:
    """While both releases run: approve `parked`, and once each turn ended
    post a follow-up with extra wake-ups, so old workers meet logs the new
    release wrote session/upgraded in at version 2 (they leave them, codever.py)."""
    for sid in parked:
        chaos.approve(sid, next(e for e in chaos.events(sid) if e.kind == "approval/requested").data["call_id"])
    for sid in parked:
        chaos.wait_kind(sid, "turn/end", timeout=60)
        chaos.post(sid, f"after the approval {sid}")
        chaos.probe.wake(sid, WAKES)


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
