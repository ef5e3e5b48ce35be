"""Bounded pending work (issue 33.6, docs/storage.md): waiting input is
bounded per session in count and bytes (the profile's max_waiting_inputs,
max_waiting_bytes), refused past either with 409 inbox_full on every door
through the one admission path (services.inputs -> admission.check_room),
writing nothing; passive writes keep their newest max_passive_inputs, the
oldest withdrawn by retention. Both databases (manual worker: the bound is
the admission's, under the row lock; the drive only takes input in)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from sessions_app import services
from sessions_app.errors import InboxFull
from sessions_app.models import Event
from sessions_app.runtime.drive import drive
from sessions_app.services import inputs
from tests.helpers import client_for, edit_profile
from tests.sessions_app.apiutil import bearer, call, event_count, new_session, token_for
from tests.sessions_app.apiutil import session_url as url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def busy(owner: Any) -> Any:
    """A session whose turn is open, with room for 3 waiting inputs."""
    session = new_session(owner)
    edit_profile(session.profile, max_waiting_inputs=3)
    services.run_turn(session.id, "busy")
    return session


def waiting(session: Any) -> int:
    return Event.objects.filter(session=session, kind__in=("input/queued", "input/deferred")).count()


def test_input_past_the_count_bound_is_409_inbox_full_on_the_api(client: Any, owner: Any, busy: Any) -> None:
    auth = bearer(token_for(owner))
    for i, lane in enumerate(("steer", "follow_up", "passive")):
        r = call(client, "POST", url(busy, "/inputs"), {"text": f"in {i}", "lane": lane}, **auth)
        assert (r.status_code, r.data["disposition"]) == (202, "queued")
    before = event_count()
    for lane in ("steer", "follow_up", "passive"):
        r = call(client, "POST", url(busy, "/inputs"), {"text": "one too many", "lane": lane}, **auth)
        assert (r.status_code, r.data["code"]) == (409, "inbox_full"), lane
        assert "max_waiting_inputs 3" in r.data["message"]
    keyed = call(client, "POST", url(busy, "/inputs"), {"text": "k"}, HTTP_IDEMPOTENCY_KEY="k1", **auth)
    assert (keyed.status_code, keyed.data["code"]) == (409, "inbox_full")
    assert event_count() == before  # nothing written, no receipt kept
    # Turns take the waiting input in: room again.
    assert drive(busy.id) == "ended"
    r = call(client, "POST", url(busy, "/inputs"), {"text": "fits now", "lane": "follow_up"}, **auth)
    assert r.status_code == 202


def test_the_byte_bound(owner: Any) -> None:
    session = new_session(owner)
    edit_profile(session.profile, max_waiting_bytes=4096)
    services.run_turn(session.id, "busy")
    services.inject(session.id, "é" * 1500)  # 3,000 bytes waiting
    with pytest.raises(InboxFull, match="3000 bytes of input waiting; 1200 more would pass"):
        services.inject(session.id, "x" * 1200, lane="follow_up")
    services.inject(session.id, "x" * 1096, lane="follow_up")  # exactly the bound
    with pytest.raises(InboxFull):
        services.inject(session.id, "y")
    assert waiting(session) == 2


def test_nothing_waiting_always_admits_one(owner: Any) -> None:
    session = new_session(owner)
    edit_profile(session.profile, max_waiting_inputs=1, max_waiting_bytes=1024)
    services.run_turn(session.id, "busy")
    big = "z" * 5000  # over the byte bound alone: the bound is on the backlog, and one input always fits
    assert services.inject(session.id, big).disposition == "queued"
    with pytest.raises(InboxFull):
        services.inject(session.id, "a")


def test_passive_writes_keep_their_newest(owner: Any, busy: Any) -> None:
    edit_profile(busy.profile, max_passive_inputs=2, max_waiting_inputs=10)
    seqs = [services.inject(busy.id, f"note {i}", lane="passive").seq for i in range(5)]
    withdrawn = Event.objects.filter(session=busy, kind="input/withdrawn").order_by("seq")
    assert [e.data["source_seq"] for e in withdrawn] == seqs[:3]
    assert {e.data["by"] for e in withdrawn} == {"retention"}
    assert [inputs.receipt(busy.id, s).disposition for s in seqs] == ["withdrawn"] * 3 + ["queued"] * 2
    # The next turn takes in the newest two only.
    assert drive(busy.id) == "ended"
    services.run_turn(busy.id, "next")
    injected = [e.data["text"] for e in Event.objects.filter(session=busy, kind="context/injected")]
    assert injected == ["note 3", "note 4"]


def test_inbox_full_through_lg_and_the_chat_page(client: Any, owner: Any, busy: Any) -> None:
    for i in range(3):
        services.inject(busy.id, f"in {i}")
    before = event_count()
    body = {"assistant_id": busy.profile.name, "input": {"messages": ["more"]}, "multitask_strategy": "enqueue"}
    lg = client.post(
        f"/lg/threads/{busy.id}/runs",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_X_API_KEY=token_for(owner),
    )
    assert (lg.status_code, lg.json()["code"]) == (409, "inbox_full")
    page = client_for(owner)
    r = page.post(reverse("sessions:message", args=[busy.id]), {"text": "more", "key": "w1"})
    assert r.status_code == 409 and "max_waiting_inputs 3" in r.content.decode()
    r = page.post(reverse("sessions:message", args=[busy.id]), {"text": "more"}, headers={"HX-Request": "true"})
    assert r["X-Terret-Error"] == "inbox_full"
    assert event_count() == before


@pytest.mark.worker
def test_under_a_worker_the_bound_holds_while_a_turn_runs_and_frees_as_it_takes_input_in(
    start_worker: Any, fake_llm: Any, session: Any, profile: Any
) -> None:
    """A real worker streams a reply that hangs; steers past the bound get
    409 and write nothing; once the turn takes the waiting steers in (its
    next step) and ends, input is admitted again. The model sees exactly the
    admitted steers (counted at the fake server)."""
    import threading

    from tests.fakes.fake_llm import Reply
    from tests.helpers import wait_for

    edit_profile(profile, max_waiting_inputs=2)
    release = threading.Event()
    fake_llm.script(Reply(tool_calls=[("debug.noop", {})], hang=release), Reply(text="took them in"))
    start_worker(name="a")
    services.inject(session.id, "start")
    wait_for(lambda: len(fake_llm.requests) == 1, what="the first model request")
    services.inject(session.id, "steer 1")
    services.inject(session.id, "steer 2")
    before = Event.objects.filter(session=session).count()
    with pytest.raises(InboxFull):
        services.inject(session.id, "steer 3")
    assert Event.objects.filter(session=session).count() == before
    release.set()
    wait_for(lambda: Event.objects.filter(session=session, kind="turn/end").exists(), what="the turn's end")
    assert len(fake_llm.requests) == 2
    said = json.dumps(fake_llm.requests[1]["messages"])
    assert "steer 1" in said and "steer 2" in said and "steer 3" not in said
    fake_llm.script(Reply(text="again"))
    assert services.inject(session.id, "steer 3").disposition in ("started", "queued")
