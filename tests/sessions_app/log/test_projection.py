"""derive_messages: the model's view of the log, in OpenAI chat format."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.log import append
from sessions_app.log.projection import SUMMARY_PREFIX, derive_messages, latest_compaction, render
from sessions_app.models import Session

pytestmark = pytest.mark.django_db

CALL = {"id": "call_1", "name": "clock.now", "arguments": '{"tz": "UTC"}'}


def conversation(session: Session, tag: str) -> None:
    """One turn with a tool call, plus metadata the model must not see."""
    append(session.id, "turn/start", {})
    append(session.id, "user/message", {"text": f"{tag}: what time is it?"})
    append(session.id, "step/start", {"step": 1, "model": "demo/offline"})
    append(session.id, "assistant/message", {"content": None, "tool_calls": [CALL]})
    append(session.id, "tool/result", {"call_id": "call_1", "name": "clock.now", "content": "12:00"})
    append(session.id, "step/end", {"step": 1})
    append(session.id, "session/titled", {"title": f"{tag} title"})
    append(session.id, "assistant/message", {"content": f"{tag}: it is noon"})
    append(session.id, "turn/end", {"status": "completed"})


def compact(session: Session, summary: str) -> int:
    session.refresh_from_db()
    return append(session.id, "session/compacted", {"upto_seq": session.last_seq, "summary": summary}).seq


def expected_turn(tag: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"{tag}: what time is it?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "clock.now", "arguments": '{"tz": "UTC"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "assistant", "content": f"{tag}: it is noon"},
    ]


def summary(text: str) -> dict[str, str]:
    return {"role": "user", "content": SUMMARY_PREFIX + text}


def test_empty_session(make_session: Any) -> None:
    assert derive_messages(make_session().id) == []


def test_no_compaction_shows_every_model_visible_event(make_session: Any) -> None:
    s = make_session()
    conversation(s, "A")
    append(s.id, "input/queued", {"text": "queued, not yet seen", "wake": False})
    append(s.id, "context/injected", {"text": "steer"})
    assert derive_messages(s.id) == [*expected_turn("A"), {"role": "user", "content": "steer"}]
    assert latest_compaction(s.id) is None


def test_one_compaction_replaces_what_it_covers(make_session: Any) -> None:
    s = make_session()
    conversation(s, "A")
    seq = compact(s, "A happened")
    conversation(s, "B")
    assert derive_messages(s.id) == [summary("A happened"), *expected_turn("B")]
    found = latest_compaction(s.id)
    assert found is not None and found[0] == seq


def test_two_compactions_only_the_latest_applies(make_session: Any) -> None:
    s = make_session()
    conversation(s, "A")
    first = compact(s, "A happened")
    conversation(s, "B")
    second = compact(s, "A and B happened")
    conversation(s, "C")
    messages = derive_messages(s.id)
    assert messages == [summary("A and B happened"), *expected_turn("C")]
    # The superseded summary and everything the newer one covers drop out.
    text = json.dumps(messages)
    assert 'A happened"' not in text and "B: it is noon" not in text
    found = latest_compaction(s.id)
    assert found is not None and found[0] == second > first


def test_compaction_as_the_last_event(make_session: Any) -> None:
    s = make_session()
    conversation(s, "A")
    compact(s, "all of it")
    assert derive_messages(s.id) == [summary("all of it")]


def test_until_seq_is_the_view_as_of_that_seq(make_session: Any) -> None:
    s = make_session()
    conversation(s, "A")
    s.refresh_from_db()
    head = s.last_seq
    compact(s, "A happened")
    conversation(s, "B")
    # As of `head` the compaction did not exist yet: the full turn A shows.
    assert derive_messages(s.id, until_seq=head) == expected_turn("A")
    assert derive_messages(s.id, until_seq=head + 1) == [summary("A happened")]
    assert derive_messages(s.id, until_seq=head + 3) == [summary("A happened"), expected_turn("B")[0]]


def test_render_formats() -> None:
    assert render("user/message", {"text": "hi", "source_seq": 3}) == {"role": "user", "content": "hi"}
    assert render("context/injected", {"text": "x"}) == {"role": "user", "content": "x"}
    # No tool_calls key at all when there are none: some providers reject [].
    assert render("assistant/message", {"content": "a"}) == {"role": "assistant", "content": "a"}
    assert render("assistant/message", {"content": "a", "tool_calls": []}) == {"role": "assistant", "content": "a"}
    two = render(
        "assistant/message",
        {"content": "", "tool_calls": [CALL, {**CALL, "id": "call_2", "name": "workspace.read"}], "usage": {}},
    )
    assert [c["id"] for c in two["tool_calls"]] == ["call_1", "call_2"]
    assert two["tool_calls"][1]["function"] == {"name": "workspace.read", "arguments": '{"tz": "UTC"}'}
    assert "usage" not in two  # bookkeeping never reaches the model
    assert render("tool/result", {"call_id": "c", "name": "n", "content": "boom", "is_error": True}) == {
        "role": "tool",
        "tool_call_id": "c",
        "content": "boom",
    }
    with pytest.raises(ValueError):
        render("session/titled", {"title": "t"})


def _bulk_history(session: Session, n: int) -> None:
    """n events of history, written in one statement. Test data only: going
    through append() would take thousands of round trips, and what is under
    test here is the read."""
    now = datetime.now(UTC)
    kinds = [
        ("user/message", {"text": "old question"}),
        ("assistant/message", {"content": "old answer"}),
        ("step/end", {"step": 1}),
    ]
    sid: Any = session.id if connection.vendor == "postgresql" else session.id.hex
    rows = []
    for seq in range(1, n + 1):
        kind, data = kinds[seq % 3]
        rows.append((sid, seq, kind, json.dumps(data), now if connection.vendor == "postgresql" else now.isoformat()))
    with connection.cursor() as cur:
        cur.executemany(
            "INSERT INTO sessions_app_event (session_id, seq, kind, data, created_at) VALUES (%s, %s, %s, %s, %s)",
            rows,
        )
        cur.execute(
            "UPDATE sessions_app_session SET last_seq = %s WHERE id = %s",
            [n, sid],
        )
        if connection.vendor == "postgresql":
            cur.execute("ANALYZE sessions_app_event")


def test_read_is_bounded_by_the_latest_compaction(make_session: Any) -> None:
    s = make_session()
    _bulk_history(s, 3000)
    seq = compact(s, "3000 events")
    conversation(s, "tail")
    with CaptureQueriesContext(connection) as ctx:
        messages = derive_messages(s.id)
    assert messages == [summary("3000 events"), *expected_turn("tail")]
    # Two indexed reads: the latest compaction, then what follows it.
    assert len(ctx.captured_queries) == 2
    tail_sql = ctx.captured_queries[1]["sql"]
    assert f'"seq" > {seq}' in tail_sql


@pytest.mark.postgres
def test_postgres_plans_touch_only_the_tail(make_session: Any) -> None:
    """Events before the compaction are never read: every scan in both plans
    returns (and discards) only a handful of rows, not the 3000 of history."""
    s = make_session()
    _bulk_history(s, 3000)
    compact(s, "3000 events")
    conversation(s, "tail")
    with CaptureQueriesContext(connection) as ctx:
        derive_messages(s.id)
    for q in ctx.captured_queries:
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + q["sql"])
            plan = cur.fetchone()[0]
            if isinstance(plan, str):
                plan = json.loads(plan)

        def touched(node: dict[str, Any]) -> int:
            own = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
            return max([own, *(touched(child) for child in node.get("Plans", []))])

        root = plan[0]["Plan"]
        assert touched(root) < 50, json.dumps(root, indent=1)
        assert "Seq Scan" not in json.dumps(root)


@pytest.mark.embedded
def test_embedded_derive_messages(make_session: Any) -> None:
    s = make_session()
    conversation(s, "A")
    compact(s, "A happened")
    conversation(s, "B")
    assert derive_messages(str(s.id)) == [summary("A happened"), *expected_turn("B")]
