"""Issue 27, "Under fire": admission, follow-up opening, interrupts, cancels,
wake races and takeovers, all at once against two real Celery worker
processes on PostgreSQL, while a slow turn streams. After every round the
log's invariants are checked from the database (tests/chaos/invariants.py):
never a second turn/start while a turn is open, every follow-up in a turn of
its own in arrival order (never folded into another input's turn), every
accepted input answered or withdrawn, every receipt's disposition true of
the log, every /lg/ run ended, the effect audit clean, and no more model
requests than steps asked (each counted at the fake server).

ROUNDS rounds of each kind: INPUTS concurrent `multitask_strategy:
interrupt` inputs, and INPUTS follow-ups mixed with plain (steer) input and
enqueues. Two rounds of each kill the driving worker mid-round (kill -9)
and start a replacement. TERRET_CHAOS_SEED replays a run's choices."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from sessions_app import services
from sessions_app.lg import mapping
from sessions_app.lg import ops as lg_ops
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.dispatch import send_drive
from sessions_app.runtime.effects import effects_audit
from sessions_app.services import inputs
from tests.chaos.invariants import Ev, input_problems, lane_problems, log_problems, receipt_problems
from tests.fakes.fake_llm import Reply
from tests.helpers import wait_for
from tests.workers import WorkerProcess

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ROUNDS = int(os.environ.get("TERRET_UNDER_FIRE_ROUNDS", "8"))
INPUTS = 30
THREADS = 8  # the test process's own admission threads (each its own connection)
KILL_ROUNDS = (2, 5)
SLOW = "slow turn"


def reply(body: dict[str, Any]) -> Reply:
    """The slow turn streams for about a second; every other turn a little."""
    users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
    if users and users[-1] == SLOW:
        return Reply(text=" ".join(f"w{i}" for i in range(20)), chunk_delay=0.05)
    return Reply(text="ok, noted", chunk_delay=0.01)


@pytest.fixture
def fire(start_worker: Any, fake_llm: Any, make_user: Any, settings: Any, tmp_path: Any) -> Fire:
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    fake_llm.responder = reply
    profile = AgentProfile.objects.create(name="fire", roles={"main": "test/model"}, allow_floor=["*"])
    workers = [start_worker(name="a"), start_worker(name="b")]
    seed = int(os.environ.get("TERRET_CHAOS_SEED") or random.SystemRandom().randrange(1, 2**31))
    print(f"\n[under fire] seed {seed} (replay: TERRET_CHAOS_SEED={seed})")
    return Fire(make_user(), profile, workers, start_worker, fake_llm, random.Random(seed))


class Fire:
    def __init__(
        self, user: Any, profile: AgentProfile, workers: list[WorkerProcess], start: Any, llm: Any, rng: random.Random
    ) -> None:
        self.user, self.profile, self.workers, self.start, self.llm, self.rng = user, profile, workers, start, llm, rng
        self.kills = 0

    def round(self, mode: str, number: int) -> dict[str, int]:
        """One round on a fresh session: the slow turn, then the burst; settled and checked."""
        session = services.create_session(self.user, self.profile)
        sid = str(session.id)
        asked_before = len(self.llm.requests)
        receipts = [inputs.inject(sid, SLOW).as_json()]
        wait_for(lambda: len(self.llm.requests) > asked_before, what="the slow turn's model request")
        moves = self.moves(sid, mode)
        kill = threading.Thread(target=self.kill_driver, args=(sid,)) if number in KILL_ROUNDS else None
        if kill is not None:
            kill.start()
        with ThreadPoolExecutor(THREADS) as pool:
            for got in pool.map(_own_connection, moves):
                if got is not None:
                    receipts.append(got)
        if kill is not None:
            kill.join()
        wait_for(lambda: settled(sid), timeout=120, what=f"round {number} ({mode}) to settle")
        return self.check(session, receipts, len(self.llm.requests) - asked_before, kill is not None)

    def moves(self, sid: str, mode: str) -> list[Callable[[], dict[str, Any] | None]]:
        """INPUTS inputs of the round's kind, with cancels and wake races among them, shuffled."""

        def admit(i: int) -> Callable[[], dict[str, Any] | None]:
            kind = "interrupt" if mode == "interrupt" else self.rng.choice(["follow_up", "plain", "enqueue"])
            kwargs: dict[str, Any] = {
                "interrupt": {"multitask_strategy": "interrupt"},
                "follow_up": {"lane": "follow_up"},
                "plain": {},
                "enqueue": {"multitask_strategy": "enqueue"},
            }[kind]
            return lambda: inputs.inject(sid, f"{kind} {i}", **kwargs).as_json()

        def cancel() -> None:
            inputs.cancel(sid, by="fire")

        def wakes() -> None:
            for _ in range(5):
                send_drive(sid)

        out = [admit(i) for i in range(INPUTS)] + [cancel] * 3 + [wakes] * 3
        self.rng.shuffle(out)
        return out  # type: ignore[return-value]

    def kill_driver(self, sid: str) -> None:
        """A takeover: kill -9 the worker holding the lease mid-burst, start another."""
        time.sleep(self.rng.uniform(0.05, 0.4))
        owner = wait_for(lambda: _lease_owner(sid), timeout=10, what="a driving worker")
        pid = int(owner.split(":")[1])
        victim = next((w for w in self.workers if w.pid == pid), None)
        if victim is None:
            return
        victim.kill()
        self.kills += 1
        self.workers.remove(victim)
        self.workers.append(self.start(name=f"r{self.kills}", wait=False))

    def check(self, session: Session, receipts: list[dict[str, Any]], requests: int, killed: bool) -> dict[str, int]:
        events = [
            Ev(seq, kind, data, at.timestamp())
            for seq, kind, data, at in Event.objects.filter(session=session)
            .order_by("seq")
            .values_list("seq", "kind", "data", "created_at")
        ]
        reread = [inputs.receipt(session.id, int(r["seq"])).as_json() for r in receipts]
        problems = log_problems(events) + input_problems(events, receipts) + lane_problems(events)
        problems += receipt_problems(events, reread)
        problems += [
            f"input {r['seq']} is {r['disposition']} once settled"
            for r in reread
            if r["disposition"] not in ("answered", "withdrawn")
        ]
        problems += [
            f"/lg/ run of {n} is {s}" for n, s in _lg_runs(self.user, session, receipts) if s in ("pending", "running")
        ]
        audit = effects_audit(session.id)
        problems += [f"effect audit: {p}" for p in audit.problems]
        steps = sum(e.kind == "step/start" for e in events)
        if requests > steps + (1 if killed else 0):
            problems.append(f"{requests} model requests for {steps} steps")
        if problems:
            timeline = " ".join(f"{e.seq}:{e.kind}" for e in events)
            pytest.fail(f"session {session.id}:\n  " + "\n  ".join(problems) + f"\n  log: {timeline}")
        return {"turns": sum(e.kind == "turn/start" for e in events), "inputs": len(receipts), "requests": requests}


def _own_connection(move: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    try:
        return move()
    finally:
        connection.close()


def _lease_owner(sid: str) -> str:
    return str(Session.objects.values_list("lease_owner", flat=True).get(id=sid) or "")


def settled(sid: str) -> bool:
    """No open turn, no follow-up owed a turn, no steer waiting to be taken in."""
    row = Session.objects.values("open_turn_seq", "queued_follow_ups", "inbox_seq", "last_input_seq").get(id=sid)
    return row["open_turn_seq"] is None and row["queued_follow_ups"] == 0 and row["last_input_seq"] <= row["inbox_seq"]


def _lg_runs(user: Any, session: Session, receipts: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Each input's /lg/ run and its status, as a LangGraph client reads it: a
    run is named by the turn an input started, or by the input it queued."""
    out = []
    for r in receipts:
        if r["disposition"] != "started" and r.get("lane") != "follow_up":
            continue  # a steer rides a turn: it names no run of its own
        named = r["turn_seq"] if r["disposition"] == "started" else r["seq"]
        run = lg_ops.get_run(user, session.id, mapping.run_id(session.id, named))
        out.append((int(r["seq"]), str(run["status"])))
    return out


def test_never_two_open_turns_under_fire(fire: Fire) -> None:
    figures: list[dict[str, int]] = []
    started = time.monotonic()
    for number in range(ROUNDS):
        for mode in ("interrupt", "mixed"):
            figures.append(fire.round(mode, number))
        for worker in fire.workers:
            worker.wait_ready()  # a replacement is ready before the next round
    turns = sum(f["turns"] for f in figures)
    print(
        f"[under fire] {len(figures)} rounds in {time.monotonic() - started:.1f}s: "
        f"{sum(f['inputs'] for f in figures)} inputs, {turns} turns, "
        f"{sum(f['requests'] for f in figures)} model requests, {fire.kills} kills"
    )
    assert len(figures) == 2 * ROUNDS and fire.kills == 2 * len([n for n in KILL_ROUNDS if n < ROUNDS])
