"""Reload mid-stream keeps the partial reply: the worker keeps the open
step's streamed text (log/partial.py: Redis when configured, else memory),
and a socket that connects mid-reply sends it once it has caught up, as a
`partial` frame (JSON socket) or the streaming bubble (chat page). The log
is unchanged. The turn runs in a real drive (the runner, FakeLLM at the HTTP
boundary, streaming and then holding after its first chunk)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.conf import settings

from sessions_app import services
from sessions_app.log import partial
from sessions_app.models import Event
from sessions_app.runtime.drive import drive
from tests.fakes.fake_llm import Reply
from tests.sessions_app.apiutil import token_for
from tests.sessions_app.sockutil import db, fresh_channel_layer, open_socket, recv_until

_ = fresh_channel_layer  # an autouse fixture

STORY = "Once upon a time there was an append-only log that never forgot a thing."


# ---------------------------------------------------------------- the store


@pytest.mark.parametrize("redis", [False, True])
def test_a_recorder_keeps_the_steps_text_bounded_and_drops_it_at_the_end(
    redis: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    if redis and not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL")
    if not redis:
        monkeypatch.setattr(settings, "REDIS_URL", None)
    store = partial.store()
    assert isinstance(store, partial.RedisStore if redis else partial.MemoryStore)
    sid = uuid.uuid4()
    monkeypatch.setattr(partial, "MAX_CHARS", 12)
    kept = partial.Recorder(sid, 3)
    assert partial.so_far(sid) is None  # nothing streamed yet
    for piece in ("Hello", ", wor", "ld and more"):
        kept.add(piece)
    # With Redis the writes ride the hints publisher's next flush (a few ms).
    assert _eventually(lambda: partial.so_far(sid) == (3, "Hello, world"))  # the start, at most MAX_CHARS
    kept.close()
    assert _eventually(lambda: partial.so_far(sid) is None)


def _eventually(check: Any, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_a_windows_writes_to_one_key_are_merged_into_one_command() -> None:
    """What log/hints.py sends for partial.py's writes within one flush."""
    from sessions_app.log.hints import _merge, _Write

    class Pipe:
        def __init__(self) -> None:
            self.sent: list[tuple[Any, ...]] = []

        def __getattr__(self, name: str) -> Any:
            return lambda *a, **kw: self.sent.append((name, *a, *kw.values()))

    def sent(*ops: tuple[str, str, int]) -> list[tuple[Any, ...]]:
        writes: dict[str, _Write] = {}
        for op, text, ttl in ops:
            _merge(writes, "k", op, text, ttl)
        pipe = Pipe()
        for key, write in writes.items():
            write.send(pipe, key)
        return pipe.sent

    # A step's first text and two more deltas: one SET of all of it.
    assert sent(("set", "2\nHel", 900), ("append", "lo", 0), ("append", "!", 0)) == [("set", "k", "2\nHello!", 900)]
    # A reply that streamed and ended within the window: one DEL, no SET.
    assert sent(("set", "2\nHi", 900), ("delete", "", 0)) == [("delete", "k")]
    # The next step's text after the last one's DEL: the SET replaces it.
    assert sent(("delete", "", 0), ("set", "3\nNew", 900)) == [("set", "k", "3\nNew", 900)]
    # Appends to an entry written in an earlier window, with a TTL refresh.
    assert sent(("append", "a", 0), ("expire", "", 900), ("append", "b", 0)) == [
        ("append", "k", "ab"),
        ("expire", "k", 900),
    ]


@pytest.mark.parametrize("redis", [False, True])
def test_a_call_that_streamed_no_text_writes_and_deletes_nothing(redis: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply of tool calls alone (the first step of a tool-calling turn):
    no entry was written, so closing its recorder sends no DEL either."""
    import uuid

    if redis and not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL")
    if not redis:
        monkeypatch.setattr(settings, "REDIS_URL", None)
    kind = partial.RedisStore if redis else partial.MemoryStore
    calls: list[str] = []
    for name in ("start", "add", "clear"):
        original = getattr(kind, name)
        monkeypatch.setattr(kind, name, lambda self, *a, _f=original, _n=name: (calls.append(_n), _f(self, *a))[1])
    sid = uuid.uuid4()
    kept = partial.Recorder(sid, 1)
    kept.add("")  # an empty delta (a role-only chunk) keeps nothing
    kept.close()
    assert calls == []
    streamed = partial.Recorder(sid, 2)
    streamed.add("text")
    streamed.close()
    assert calls == ["start", "clear"]
    assert partial.so_far(sid) is None


def test_redis_down_costs_one_timeout_not_one_per_delta() -> None:
    """Nothing listens on this port: the first call fails, the rest are skipped."""
    import uuid

    down = partial.RedisStore("redis://127.0.0.1:1/0", "h4-down")
    sid = uuid.uuid4()
    started = time.monotonic()
    down.start(sid, 1)
    for _ in range(200):
        down.add(sid, 1, "word ")
    assert down.read(sid) is None
    assert time.monotonic() - started < 2.5  # one connect timeout at most, not 200


# ---------------------------------------------------------------- the sockets


@pytest.fixture
def streaming(fake_llm: Any, session: Any, settings: Any) -> Any:
    """A turn whose reply streams its first word, then holds until released."""
    settings.TERRET_WORKER = "manual"
    release = threading.Event()
    fake_llm.script(Reply(text=STORY, hang=release))
    services.run_turn(session.id, "tell me a story")
    worker = threading.Thread(target=drive, args=(session.id,), daemon=True)
    worker.start()
    deadline = time.monotonic() + 15
    while partial.so_far(session.id) is None:
        assert time.monotonic() < deadline, "the reply never started streaming"
        time.sleep(0.02)
    yield {"session": session, "release": release, "token": token_for(session.owner)}
    release.set()
    worker.join(30)


def kinds_in_log(session: Any) -> list[str]:
    return list(Event.objects.filter(session=session).order_by("seq").values_list("kind", flat=True))


@pytest.mark.django_db(transaction=True)
async def test_the_json_socket_sends_the_text_so_far_after_synced(streaming: dict[str, Any]) -> None:
    session = streaming["session"]
    so_far = await db(partial.so_far)(session.id)
    comm = await open_socket(f"/ws/sessions/{session.id}/?token={streaming['token']}")
    frames = await recv_until(comm, lambda f: f["type"] == "partial")
    assert [f["type"] for f in frames].index("synced") < len(frames) - 1
    first = frames[-1]
    assert first["step"] == 1 and STORY.startswith(first["text"]) and first["text"] == so_far[1]
    streaming["release"].set()
    rest = await recv_until(comm, lambda f: f.get("kind") == "assistant/message", timeout=30)
    streamed = first["text"] + "".join(f["text"] for f in rest if f["type"] == "delta" and f["step"] == 1)
    assert streamed == STORY  # the start, then the deltas after it: nothing lost, nothing twice
    [message] = [f for f in rest if f.get("kind") == "assistant/message"]
    assert message["data"]["content"] == STORY
    await comm.disconnect()
    assert "partial" not in " ".join(await db(kinds_in_log)(session))  # the log is unchanged
    assert await db(partial.so_far)(session.id) is None  # dropped at the step's end


@pytest.mark.django_db(transaction=True)
async def test_the_chat_page_socket_starts_the_bubble_with_the_text_so_far(streaming: dict[str, Any]) -> None:
    session = streaming["session"]
    head = await db(lambda: type(session).objects.get(id=session.id).last_seq)()
    comm = await open_socket(f"/ws/sessions/{session.id}/page/?after={head}&token={streaming['token']}")
    html = await comm.receive_from(timeout=10)
    assert html.startswith('<div class="text" id="stream-text" hx-swap-oob="true">Once')
    streaming["release"].set()
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_no_partial_frame_once_the_step_has_ended(fake_llm: Any, session: Any, settings: Any) -> None:
    settings.TERRET_WORKER = "manual"
    fake_llm.script(Reply(text="short"))
    await db(services.run_turn)(session.id, "hi")
    await db(drive)(session.id)
    comm = await open_socket(f"/ws/sessions/{session.id}/?token={await db(token_for)(session.owner)}")
    frames = await recv_until(comm, lambda f: f["type"] == "synced")
    assert "partial" not in [f["type"] for f in frames]
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()


def test_a_held_delta_the_text_already_holds_is_not_sent_twice() -> None:
    from sessions_app.live.follow import not_yet_in

    held = [json.dumps({"type": "delta", "step": 1, "text": t}) for t in ("upon ", "a ", "time")]
    live = json.dumps({"type": "live", "call_id": "c1"})
    assert not_yet_in(1, "Once upon a ", [held[0], live, held[1], held[2]]) == [live, held[2]]
    assert not_yet_in(1, "Once ", held) == held
    assert not_yet_in(2, "Once upon a ", held) == held  # another step's deltas all pass
