"""The event-kind catalogue: every kind validates what it should and rejects
what it should, and docs/events.md describes exactly the catalogue."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from sessions_app.log.catalogue import CATALOGUE, MODEL_VISIBLE, InvalidPayload, UnknownEventKind, validate
from sessions_app.log.projection import render

USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "cost": 0.0001}
SHA = "a" * 64
CALL = {"id": "call_1", "name": "clock.now", "arguments": '{"tz": "UTC"}'}
D64 = "a" * 64  # a version digest

# Every kind needs at least one accepted and one rejected payload here; a test
# below fails when a kind is added to the catalogue without them.

VALID: dict[str, list[dict[str, Any]]] = {
    "user/message": [
        {"text": "hi"},
        {"text": "", "source_seq": 1},
        {"text": "later", "source_seq": 5, "lane": "follow_up"},
    ],
    "context/injected": [
        {"text": "steer"},
        {"text": "x", "source_seq": 9},
        {"text": "evidence", "source_seq": 7, "lane": "passive"},
        {"text": "later", "source_seq": 8, "lane": "follow_up"},
    ],
    "input/deferred": [
        {"text": "after this", "lane": "follow_up"},
        {"text": "note", "lane": "passive", "by": "owner", "idempotency_key": "k"},
        {"text": "wake", "lane": "follow_up", "by": "schedule:1", "schedule_id": "1"},
        {"text": "[task t (command) completed] {}", "lane": "follow_up", "by": "task:t", "task_id": "t"},
    ],
    "input/withdrawn": [
        {"source_seq": 4, "lane": "steer", "inbox_to": 6, "by": "owner"},
        {"source_seq": 5, "lane": "follow_up", "deferred_to": 5},
        {"source_seq": 6, "lane": "passive", "unhold": True},
    ],
    "schedule/created": [
        {"schedule_id": "s", "misfire": "skip"},
        {
            "schedule_id": "s",
            "misfire": "run_once",
            "by": "agent",
            "due_at": "2026-12-01T10:00:00+00:00",
            "every_seconds": 60,
            "cron": "",
            "max_runs": None,
            "reason": "feed",
        },
    ],
    "schedule/fired": [
        {"schedule_id": "s", "due_at": "2026-12-01T10:00:00+00:00", "late_ms": 12, "run": 1, "input_seq": 9},
        {
            "schedule_id": "s",
            "due_at": "2026-12-01T10:00:00+00:00",
            "late_ms": 190000,
            "run": 2,
            "input_seq": 19,
            "missed": 3,
            "worker": "h:1",
        },
    ],
    "schedule/cancelled": [{"schedule_id": "s"}, {"schedule_id": "s", "by": "terret", "reason": "revoked"}],
    "schedule/paused": [{"schedule_id": "s", "reason": "no progress", "runs": 3}],
    "monitor/edition": [
        {"monitor_id": "m", "edition_id": "e", "period": 1, "digest": "", "items": []},
        {"monitor_id": "m", "edition_id": "e", "period": 2, "digest": "d", "items": [{"id": "i", "version": "v"}]},
    ],
    "assistant/message": [
        {"content": "hello"},
        {"content": None, "tool_calls": [CALL]},
        {"content": "two", "tool_calls": [CALL, {**CALL, "id": "call_2"}], "usage": USAGE},
    ],
    "tool/result": [
        {"call_id": "call_1", "name": "clock.now", "content": "12:00"},
        {"call_id": "call_1", "name": "clock.now", "content": "denied", "is_error": True},
        {"call_id": "call_1", "name": "debug.charge", "content": "ok", "attempt": 2, "via": "operator"},
    ],
    "session/upgraded": [
        {
            "from": {"number": 1, "digest": D64},
            "to": {"number": 2, "digest": D64},
            "by": "policy",
        },
        {
            "from": None,
            "to": {"number": 1, "digest": D64},
            "by": "alice",
        },
        {"from": {"number": 1, "digest": None}, "to": {"number": 2, "digest": None}, "by": "policy"},
    ],
    "session/suspended": [{"by": "ops"}, {"by": "ops", "reason": "incident"}],
    "session/resumed": [{"by": "ops"}],
    "session/revoked": [{"by": "ops", "reason": "leaked key"}],
    "session/restored": [{"by": "ops"}],
    "budget/updated": [
        {"cost_usd": None, "tokens": None, "steps": None, "turns": None},
        {"cost_usd": 1.5, "tokens": 100000, "steps": 50, "turns": 0, "by": "owner"},
    ],
    "input/held": [
        {"source_seq": 4, "reason": {"budget": "turns", "scope": "session", "limit": 1, "spent": 1}},
        {
            "source_seq": 9,
            "reason": {"budget": "cost_usd", "scope": "global", "limit": 10.0, "spent": 0.5, "unpriced": 2},
            "text": "the daily global cost budget cannot be enforced",
        },
    ],
    "tool/attempt": [
        {"call_id": "c", "name": "debug.charge", "attempt": 1, "idempotency_key": "k", "replay": "never", "fence": 0},
        {
            "call_id": "c",
            "name": "workspace.write",
            "attempt": 2,
            "idempotency_key": "k",
            "replay": "reconcile",
            "fence": 7,
            "step": 1,
            "worker": "h:1:t",
            "replaces": 1,
            "why": "not_done",
        },
    ],
    "tool/unknown": [
        {"call_id": "c", "name": "debug.charge", "attempt": 1, "reason": "the worker stopped"},
        {"call_id": "edition-e", "name": "monitor.publish", "attempt": 1, "reason": "dropped", "edition_id": "e"},
    ],
    "tool/receipt": [
        {
            "call_id": "edition-e",
            "name": "monitor.publish",
            "attempt": 1,
            "content": "r1",
            "receipt": "r1",
            "edition_id": "e",
        },
        {
            "call_id": "edition-e",
            "name": "monitor.publish",
            "attempt": 2,
            "content": "HTTP 503",
            "is_error": True,
            "edition_id": "e",
        },
    ],
    "tool/resolved": [
        {"call_id": "c", "attempt": 1, "action": a, "by": "staff:ops"} for a in ("rerun", "done", "failed")
    ]
    + [{"call_id": "c", "attempt": 1, "action": "done", "result": "charged", "reason": "checked", "by": "ops"}]
    + [{"call_id": "edition-e", "attempt": 1, "action": "rerun", "by": "terret", "edition_id": "e"}],
    "session/compacted": [
        {"upto_seq": 0, "summary": ""},
        {"upto_seq": 120, "summary": "so far"},
        {"upto_seq": 130, "summary": "mid-turn", "turn_seq": 101},
    ],
    "model/window": [
        {"spec": "openai/gpt-4o-mini", "tokens": 128000, "source": "error"},
        {"role": "compactor", "spec": "x/y", "tokens": 8192, "source": "error"},
        {"role": "main", "spec": "x/y", "tokens": 4096, "source": "refusal"},
    ],
    "turn/start": [
        {},
        {"by": "alice"},
        {"version": {"number": 2, "digest": D64}},
    ],
    "turn/end": [{"status": s} for s in ("completed", "cancelled", "rejected", "empty", "failed")]
    + [
        {"status": "failed", "error": "boom"},
        {"status": "rejected", "reason": {"budget": "steps", "scope": "profile", "limit": 10, "spent": 10}},
    ],
    "turn/cancel_requested": [{}, {"by": "alice", "reason": "enough"}],
    "step/start": [{"step": 1, "model": "demo/offline"}],
    "step/end": [
        {"step": 1},
        {"step": 2, "usage": USAGE},
        {"step": 3, "usage": {"prompt_tokens": 0, "completion_tokens": 0}},
        {"step": 4, "usage": {**USAGE, "cost": None}},
        {"step": 5, "usage_recorded": True},
        {"step": 6, "usage": USAGE, "model": "x/y", "latency_ms": 812},
    ],
    "usage/recorded": [
        {"purpose": "title", "usage": USAGE},
        {"purpose": "compaction", "model": "x/y", "usage": {**USAGE, "cost": None}},
        {"purpose": "step", "model": "x/y", "usage": None, "step": 2, "reason": "the worker stopped"},
        {"purpose": "step", "usage": USAGE, "step": 1},
        {"purpose": "digest", "model": "x/y", "usage": USAGE},
    ],
    "input/queued": [
        {"text": "later", "wake": False},
        {"text": "now", "wake": True, "idempotency_key": "k", "by": "a"},
    ],
    "approval/requested": [
        {"call_id": "c", "name": "shell.run", "args": {}},
        {"call_id": "c", "name": "n", "args": {"a": [1]}},
        {"call_id": "c", "name": "n", "args": {}, "deadline": {"deadline_s": 5, "on_expiry": "deny"}},
        {
            "call_id": "c",
            "name": "n",
            "args": {},
            "deadline": {"deadline_s": None, "remind_every_s": 60, "escalate_to": "ops", "on_expiry": "park"},
        },
    ],
    "approval/resolved": [
        {"call_id": "c", "verdict": "approve"},
        {"call_id": "c", "verdict": "deny", "reason": "no", "by": "b"},
        {
            "call_id": "c",
            "verdict": "approve",
            "by": "b",
            "grounds": {"as": "reviewers", "group": "reviewers", "user_id": 3, "policy_seq": 7},
        },
        {"call_id": "c", "verdict": "deny", "by": "b", "grounds": {"as": "staff", "user_id": 1, "policy_seq": None}},
    ],
    "approval/voided": [
        {"call_id": "c", "request_seq": 4, "verdict_seq": 5, "reason": "reviewer_inactive", "by": "b"},
        {"call_id": "c", "request_seq": 4, "verdict_seq": 5, "reason": "session_revoked"},
    ],
    "approval/reminded": [{"call_id": "c", "request_seq": 4, "n": 1, "waited_s": 60.2}],
    "approval/escalated": [
        {"call_id": "c", "request_seq": 4, "to": "ops", "waited_s": 600},
        {"call_id": "c", "request_seq": 4, "to": None, "waited_s": 600.5},
    ],
    "approval/expired": [
        {"call_id": "c", "request_seq": 4, "deadline_s": 5, "on_expiry": "deny"},
        {"call_id": "c", "request_seq": 4, "deadline_s": 600, "on_expiry": "park"},
    ],
    "session/titled": [{"title": "T"}, {"title": "x" * 80}, {"title": "Mine", "by": "owner"}],
    "session/archived": [{}, {"by": "owner"}],
    "session/unarchived": [{"by": "owner"}],
    "storage/cold": [
        {"through_seq": 9, "events": 9, "bytes": 900, "stored_bytes": 120, "sha256": SHA},
        {"through_seq": 9, "events": 8, "bytes": 0, "stored_bytes": 0, "sha256": SHA, "by": "policy"},
    ],
    "storage/hot": [{"through_seq": 9}, {"through_seq": 9, "events": 9, "by": "staff"}],
    "storage/deleted": [{"through_seq": 0}, {"through_seq": 9, "events": 9, "by": "policy"}],
    "policy/updated": [{"patterns": []}, {"patterns": ["clock.*", "workspace.read"], "by": "admin"}],
    "model/updated": [{"role": r, "spec": "openai/gpt-4o-mini"} for r in ("main", "titler", "compactor")],
    "agent/spawned": [{"agent_id": "a-1", "profile": "default"}, {"agent_id": "a-1", "profile": "p", "live": 3}],
    "agent/disposed": [
        {"agent_id": "a-1"},
        {"agent_id": "a-1", "reason": "evicted"},
        {"agent_id": "a", "reason": "operator", "by": "ops"},
    ],
    "agent/waiting": [{"reason": "full"}, {"reason": "full", "live": 8}],
    "turn/stalled": [
        {"attempt": 1, "error": "HTTP 503", "retry_in": 40.0},
        {"since": "2026-12-05T07:00:00+00:00", "phase": "model"},
        {"since": "2026-12-05T07:00:00+00:00", "phase": "tool"},
    ],
    "turn/blocked": [
        {"reason": "model call failed", "attempts": 5},
        {"reason": "model call failed", "attempts": 5, "code": "retries_exhausted"},
        {"reason": "does not fit", "attempts": 1, "code": "context_overflow"},
    ],
    "turn/retry_requested": [{}, {"by": "ops"}],
    "session/forked": [
        {"parent": "5f0c2e1a-0000-4000-8000-000000000000", "at_seq": 12, "policy": "historical", "seed_upto": 9},
        {"parent": "p", "at_seq": 3, "policy": "fresh", "seed_upto": 1, "requested_seq": 5, "by": "alice"},
    ],
    "session/forked_to": [{"child": "c", "at_seq": 12}, {"child": "c", "at_seq": 1, "policy": "current", "by": "a"}],
    "document/written": [
        {
            "name": "a.txt",
            "kind": "file",
            "scope": "conversation",
            "incarnation": 1,
            "version": 1,
            "sha256": D64,
            "size": 0,
        },
        {
            "name": "s.json",
            "kind": "json",
            "scope": "task",
            "incarnation": 2,
            "version": 3,
            "sha256": D64,
            "size": 9,
            "schema": "plan",
            "schema_version": 2,
            "migrated_from": 1,
            "task": "t1",
            "call_id": "c",
            "by": "a",
        },
    ],
    "document/retired": [
        {"name": "a", "incarnation": 1, "reason": "deleted"},
        {"name": "a", "incarnation": 2, "reason": "task_ended", "by": "x"},
    ],
    "task/started": [
        {"task_id": "t", "kind": "command", "version": 1, "background": True, "call_id": "c", "argv": ["sh"]},
        {"task_id": "t", "kind": "subagent", "version": 1, "background": False, "profile": "p", "child_session": "s"},
    ],
    "task/waiting": [
        {"call_id": "c", "task_ids": ["t"], "live": 1},
        {"call_id": "c", "task_ids": ["t"], "live": 0, "deadline_at": "2026-12-05T10:00:00+00:00"},
    ],
    "task/wait_ended": [{"call_id": "c", "reason": "timeout", "live": 2}],
    "task/progress": [{"task_id": "t", "age_s": 1.5, "output": "so far"}, {"task_id": "t", "age_s": 0}],
    "task/completed": [
        {"task_id": "t", "kind": "command", "waited": True, "outcome": {"exit_code": 0, "output": ""}},
        {"task_id": "t", "kind": "subagent", "waited": False, "outcome": {"answer": "a"}, "generation": 1},
    ],
    "task/failed": [
        {"task_id": "t", "kind": "command", "waited": False, "reason": {"code": "supervisor_lost"}},
        {"task_id": "t", "kind": "command", "waited": True, "outcome": None, "reason": {"code": "timeout"}},
    ],
    "task/cancelled": [{"task_id": "t", "kind": "command", "waited": True, "reason": {"code": "cancelled"}}],
    "task/blocked": [{"task_id": "t", "code": "definition_missing", "what": "task kind command v1", "reason": "r"}],
}

INVALID: dict[str, list[Any]] = {
    "user/message": [{}, {"text": 1}, {"text": "x", "source_seq": 0}, {"text": "x", "source": 1}],
    "context/injected": [{}, {"text": None}, {"text": "x", "source_seq": "3"}],
    "assistant/message": [
        {"content": 5},
        {"tool_calls": [{"id": "", "name": "n", "arguments": "{}"}]},
        {"tool_calls": [{"id": "c", "name": "n", "arguments": {}}]},  # arguments stay JSON text
        {"tool_calls": [{"id": "c", "name": "n"}]},
        {"tool_calls": {"id": "c"}},
        {"content": "x", "role": "assistant"},
        {"content": "x", "usage": {"prompt_tokens": 1}},
    ],
    "tool/result": [
        {"call_id": "c", "name": "n"},
        {"call_id": "", "name": "n", "content": "x"},
        {"call_id": "c", "name": "n", "content": "x", "is_error": "yes"},
        {"call_id": "c", "name": "n", "content": "x", "attempt": 0},
        {"call_id": "c", "name": "n", "content": "x", "via": "magic"},
    ],
    "session/compacted": [
        {"summary": "s"},
        {"upto_seq": -1, "summary": "s"},
        {"upto_seq": 1.5, "summary": "s"},
        {"upto_seq": 1, "summary": "s", "turn_seq": 0},
    ],
    "model/window": [
        {"spec": "x/y", "tokens": 0, "source": "error"},
        {"spec": "x/y", "tokens": 8192, "source": "guess"},
        {"spec": "", "tokens": 8192, "source": "error"},
    ],
    "turn/start": [{"by": 1}, {"who": "x"}, {"version": {"number": 0, "digest": "x"}}, {"version": {"number": 1}}],
    "turn/end": [{}, {"status": "done"}, {"status": "completed", "error": None}],
    "turn/cancel_requested": [{"reason": 3}],
    "step/start": [{"step": 1}, {"step": 0, "model": "m"}, {"step": 1, "model": ""}, {"step": True, "model": "m"}],
    "step/end": [
        {},
        {"step": 1, "usage": {"prompt_tokens": 1}},
        {"step": 1, "usage": {"prompt_tokens": -1, "completion_tokens": 0}},
        {"step": 1, "usage": {**USAGE, "cost": -0.1}},
        {"step": 1, "usage": {**USAGE, "currency": "USD"}},
    ],
    "usage/recorded": [
        {"purpose": "title"},
        {"purpose": "chat", "usage": USAGE},
        {"usage": USAGE},
        {"purpose": "step", "usage": "none"},
        {"purpose": "step", "usage": None, "step": 0},
    ],
    "input/queued": [{"text": "x"}, {"wake": True}, {"text": "x", "wake": "yes"}],
    "input/deferred": [{"text": "x"}, {"text": "x", "lane": "steer"}, {"lane": "passive"}],
    "input/withdrawn": [{"source_seq": 4}, {"source_seq": 4, "lane": "later"}, {"source_seq": 0, "lane": "steer"}],
    "schedule/created": [{"schedule_id": "s"}, {"schedule_id": "", "misfire": "skip"}],
    "schedule/fired": [{"schedule_id": "s", "due_at": "x", "late_ms": -1, "run": 1, "input_seq": 1}],
    "schedule/cancelled": [{}, {"schedule_id": ""}],
    "schedule/paused": [{"schedule_id": "s"}],
    "monitor/edition": [
        {"monitor_id": "m", "edition_id": "e", "period": 0, "digest": "", "items": []},
        {"monitor_id": "m", "edition_id": "e", "period": 1, "items": []},
        {"monitor_id": "", "edition_id": "e", "period": 1, "digest": "", "items": []},
    ],
    "approval/requested": [
        {"call_id": "c", "name": "n"},
        {"call_id": "c", "name": "n", "args": "{}"},
        {"call_id": "c", "name": "n", "args": {}, "deadline": {"deadline_s": 5, "on_expiry": "later"}},
    ],
    "approval/resolved": [
        {"call_id": "c"},
        {"call_id": "c", "verdict": "maybe"},
        {"call_id": "c", "verdict": "approve", "grounds": {"as": "friend", "user_id": 1, "policy_seq": None}},
        {"call_id": "c", "verdict": "approve", "grounds": {"as": "staff"}},
    ],
    "approval/voided": [{"call_id": "c", "request_seq": 4, "verdict_seq": 5}, {"call_id": "c", "reason": "x"}],
    "approval/reminded": [{"call_id": "c", "request_seq": 4, "n": 0, "waited_s": 1}],
    "approval/escalated": [{"call_id": "c", "request_seq": 4, "waited_s": 1}],
    "approval/expired": [
        {"call_id": "c", "request_seq": 4, "deadline_s": 5, "on_expiry": "approve"},
        {"call_id": "c", "request_seq": 4, "deadline_s": 0, "on_expiry": "deny"},
    ],
    "session/upgraded": [
        {"from": 1, "to": 2, "by": "p"},  # version 1's shape: read lifted, never written any more
        {"from": None, "to": {"number": 0, "digest": None}, "by": "p"},
        {"from": None, "to": {"number": 1, "digest": "abc"}, "by": "p"},
        {"from": None, "to": {"number": 1}, "by": "p"},
    ],
    "session/suspended": [{}, {"by": ""}],
    "session/resumed": [{"reason": "x"}],
    "session/revoked": [{"by": 3}],
    "session/restored": [{"by": "ops", "extra": 1}],
    "budget/updated": [
        {"cost_usd": None, "tokens": None, "steps": None},
        {"cost_usd": -1, "tokens": None, "steps": None, "turns": None},
        {"cost_usd": None, "tokens": 1.5, "steps": None, "turns": None},
    ],
    "input/held": [
        {"source_seq": 4},
        {"source_seq": 4, "reason": {"budget": "money", "scope": "session", "limit": 1, "spent": 1}},
    ],
    "tool/attempt": [
        {"call_id": "c", "name": "t", "attempt": 0, "idempotency_key": "k", "replay": "never", "fence": 0},
        {"call_id": "c", "name": "t", "attempt": 1, "idempotency_key": "k", "replay": "maybe", "fence": 0},
        {"call_id": "c", "name": "t", "attempt": 1, "replay": "safe", "fence": 0},
        {"call_id": "c", "name": "t", "attempt": 2, "idempotency_key": "k", "replay": "safe", "fence": 0, "why": "x"},
    ],
    "tool/unknown": [{"call_id": "c", "name": "t"}, {"call_id": "c", "name": "t", "attempt": 1, "extra": 1}],
    "tool/receipt": [
        {"call_id": "edition-e", "name": "monitor.publish", "attempt": 1, "content": "r"},
        {"call_id": "edition-e", "name": "monitor.publish", "attempt": 1, "content": "r", "edition_id": "e", "x": 1},
        {
            "call_id": "edition-e",
            "name": "monitor.publish",
            "attempt": 1,
            "receipt": "",
            "content": "",
            "edition_id": "e",
        },
    ],
    "tool/resolved": [
        {"call_id": "c", "attempt": 1, "action": "undo", "by": "ops"},
        {"call_id": "c", "attempt": 1, "action": "done"},
    ],
    "session/titled": [{}, {"title": ""}, {"title": "x" * 81}],
    "session/archived": [{"by": 1}, {"reason": "x"}],
    "session/unarchived": [{"by": None}],
    "storage/cold": [{"through_seq": 9}, {"through_seq": 9, "events": 9, "bytes": 1, "stored_bytes": 1, "sha256": "x"}],
    "storage/hot": [{}, {"through_seq": 0}, {"through_seq": 9, "by": 1}],
    "storage/deleted": [{}, {"through_seq": -1}],
    "policy/updated": [{}, {"patterns": "clock.*"}, {"patterns": [""]}],
    "model/updated": [{"role": "main"}, {"role": "boss", "spec": "x/y"}, {"role": "main", "spec": ""}],
    "agent/spawned": [
        {"agent_id": "a"},
        {"agent_id": "", "profile": "p"},
        {"agent_id": "a", "profile": "p", "live": 0},
    ],
    "agent/disposed": [{}, {"agent_id": ""}, {"agent_id": "a", "reason": "bored"}],
    "agent/waiting": [{}, {"reason": "x", "live": -1}],
    "turn/stalled": [
        {"attempt": 0, "error": "e", "retry_in": 1},
        {"attempt": 1},
        {"since": "2026-12-05T07:00:00+00:00"},
        {"since": "", "phase": "model"},
        {"since": "2026-12-05T07:00:00+00:00", "phase": "lunch"},
        {"attempt": 1, "error": "e", "retry_in": 1, "since": "2026-12-05T07:00:00+00:00", "phase": "model"},
    ],
    "turn/blocked": [{"reason": "r"}, {"attempts": 1}, {"reason": "r", "attempts": 1, "code": "overflow"}],
    "turn/retry_requested": [{"by": 1}],
    "session/forked": [
        {"parent": "p", "at_seq": 1, "policy": "historical"},
        {"parent": "p", "at_seq": 0, "policy": "fresh", "seed_upto": 1},
        {"parent": "p", "at_seq": 1, "policy": "later", "seed_upto": 1},
    ],
    "session/forked_to": [{"child": "c"}, {"child": "", "at_seq": 1}, {"child": "c", "at_seq": 1, "policy": "x"}],
    "document/written": [
        {
            "name": "a",
            "kind": "file",
            "scope": "conversation",
            "incarnation": 1,
            "version": 1,
            "sha256": "x",
            "size": 0,
        },
        {"name": "a", "kind": "file", "scope": "folder", "incarnation": 1, "version": 1, "sha256": D64, "size": 0},
        {"name": "", "kind": "file", "scope": "task", "incarnation": 1, "version": 1, "sha256": D64, "size": 0},
    ],
    "document/retired": [
        {"name": "a", "incarnation": 0, "reason": "deleted"},
        {"name": "a", "incarnation": 1, "reason": "gone"},
    ],
    "task/started": [{"task_id": "t", "kind": "command", "version": 0, "background": True}, {"task_id": "t"}],
    "task/waiting": [{"call_id": "c", "task_ids": ["t"]}, {"call_id": "", "task_ids": [], "live": 0}],
    "task/progress": [{"task_id": "t"}, {"task_id": "t", "age_s": -1}],
    "task/wait_ended": [{"call_id": "c", "reason": "late", "live": 1}, {"call_id": "c", "reason": "timeout"}],
    "task/completed": [{"task_id": "t", "kind": "command"}, {"task_id": "", "kind": "command", "waited": True}],
    "task/failed": [{"task_id": "t", "waited": True}],
    "task/cancelled": [{"task_id": "t", "kind": "command", "waited": "yes"}],
    "task/blocked": [{"task_id": "t"}, {"task_id": "t", "code": ""}],
}

EXPECTED_MODEL_VISIBLE = {"user/message", "context/injected", "assistant/message", "tool/result", "session/compacted"}


def test_examples_cover_every_kind() -> None:
    assert set(VALID) == set(CATALOGUE)
    assert set(INVALID) == set(CATALOGUE)
    assert all(VALID[k] and INVALID[k] for k in CATALOGUE)


@pytest.mark.parametrize(("kind", "data"), [(k, d) for k, ds in VALID.items() for d in ds])
def test_valid_payload_is_accepted(kind: str, data: dict[str, Any]) -> None:
    assert validate(kind, data) is CATALOGUE[kind]


@pytest.mark.parametrize(("kind", "data"), [(k, d) for k, ds in INVALID.items() for d in ds])
def test_invalid_payload_is_rejected(kind: str, data: Any) -> None:
    with pytest.raises(InvalidPayload, match=re.escape(kind)):
        validate(kind, data)


@pytest.mark.parametrize("kind", sorted(CATALOGUE))
def test_schemas_are_closed_objects(kind: str) -> None:
    schema = CATALOGUE[kind].schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    # Non-object payloads are refused before the schema is consulted.
    for bad in (None, [], "text", 3):
        with pytest.raises(InvalidPayload):
            validate(kind, bad)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(UnknownEventKind):
        validate("user/messages", {"text": "x"})
    with pytest.raises(UnknownEventKind):
        validate("", {})


def test_error_message_names_the_field() -> None:
    with pytest.raises(InvalidPayload, match="usage/prompt_tokens"):
        validate("step/end", {"step": 1, "usage": {"prompt_tokens": -1, "completion_tokens": 0}})
    with pytest.raises(InvalidPayload, match=r"\(root\)"):
        validate("user/message", {})


def test_model_visibility() -> None:
    assert MODEL_VISIBLE == EXPECTED_MODEL_VISIBLE
    assert {k for k, spec in CATALOGUE.items() if spec.model_visible} == EXPECTED_MODEL_VISIBLE


@pytest.mark.parametrize("kind", sorted(CATALOGUE))
def test_model_visible_kinds_render_and_others_do_not(kind: str) -> None:
    for data in VALID[kind]:
        if kind in MODEL_VISIBLE:
            msg = render(kind, data)
            assert msg["role"] in {"user", "assistant", "tool"}
        else:
            with pytest.raises(ValueError):
                render(kind, data)


# --- the catalogue against docs/events.md ------------------------------------

DOC = Path(settings.BASE_DIR) / "docs" / "events.md"


def _doc_sections() -> dict[str, str]:
    text = DOC.read_text()
    parts = re.split(r"^### `([^`]+)`\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _projected_columns(kind: str) -> set[str]:
    spec = CATALOGUE[kind]
    cols: set[str] = set()
    if spec.project is None:
        return cols
    for data in VALID[kind]:
        for sql, _ in spec.project(data):
            m = re.match(r"\s*(\w+)\s*=", sql)
            assert m, sql
            cols.add(m.group(1))
    return cols


def _field(section: str, label: str) -> str:
    m = re.search(rf"^- \*\*{label}:\*\* (.+)$", section, flags=re.M)
    assert m, f"no '{label}' line"
    return m.group(1)


def test_doc_documents_exactly_the_catalogue() -> None:
    sections = _doc_sections()
    assert sorted(sections) == sorted(CATALOGUE)
    summary = set(re.findall(r"^\| `([a-z_]+/[a-z_]+)`", DOC.read_text(), flags=re.M))
    assert summary == set(CATALOGUE)


@pytest.mark.parametrize("kind", sorted(CATALOGUE))
def test_doc_section_matches_the_kind(kind: str) -> None:
    section = _doc_sections()[kind]
    spec = CATALOGUE[kind]

    visible = _field(section, "Model-visible")
    assert visible.startswith("yes" if spec.model_visible else "no"), visible

    # Parenthesised notes may name payload fields; only the columns count.
    documented = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", _field(section, "Updates"))))
    assert documented == _projected_columns(kind)

    # Every payload field has a row in the section's table, marked required
    # exactly when the schema requires it.
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)`\s*\|[^|]*\|\s*(yes|no)\s*\|", section, flags=re.M)
    }
    props = spec.schema["properties"]
    assert set(rows) == set(props)
    required = set(spec.schema.get("required", []))
    assert {f for f, req in rows.items() if req == "yes"} == required


def test_doc_summary_table_agrees_with_sections() -> None:
    text = DOC.read_text()
    for kind, spec in CATALOGUE.items():
        m = re.search(rf"^\| `{re.escape(kind)}`\s*\|\s*(yes|no)\s*\|(.*)\|\s*$", text, flags=re.M)
        assert m, kind
        assert (m.group(1) == "yes") == spec.model_visible
        assert set(re.findall(r"`(\w+)`", m.group(2))) == _projected_columns(kind)
