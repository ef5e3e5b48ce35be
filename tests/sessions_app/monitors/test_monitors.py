"""Monitors end to end in this process: the clock's work (run.tick) against
a real local feed server and a real HTTP receiver. Runs on SQLite (the
embedded path) and on PostgreSQL alike; the kill -9 tests with real worker
processes are test_worker_monitors.py."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from sessions_app.errors import InvalidInput, UnsafeUrl
from sessions_app.models import DeliveryLedger, Edition, Event, Monitor, MonitorCandidate, MonitorCheckpoint, SourceScan
from sessions_app.monitors import run
from sessions_app.runtime import effects
from sessions_app.services import monitors
from tests.sessions_app.monitors.conftest import EditionReceiver, FeedServer

pytestmark = pytest.mark.django_db


def make(session: Any, feed: FeedServer, dest: dict[str, Any], **extra: Any) -> Monitor:
    body = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed.url, "overlap_seconds": 300}],
        "destination": dest,
        **extra,
    }
    m, made = monitors.create(session.id, body, by="owner")
    assert made
    return m


def period(m: Monitor) -> Edition:
    """Make the monitor due and let the clock run it; its newest edition."""
    Monitor.objects.filter(id=m.id).update(due_at=timezone.now() - timedelta(seconds=1))
    assert run.tick() >= 1
    return Edition.objects.filter(monitor=m).order_by("-period").first()  # type: ignore[return-value]


def settle(m: Monitor) -> None:
    """Run the clock once more for the monitor's open editions (not a period)."""
    Edition.objects.filter(monitor=m, status="unknown").update(updated_at=timezone.now() - timedelta(hours=1))
    run.tick()


def webhook(r: EditionReceiver) -> dict[str, Any]:
    return {"kind": "webhook", "url": r.url}


def test_three_periods_three_confirmed_editions_each_item_once(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.page_size = 3  # paging: the first period reads the whole feed over several pages
    for n in (7, 2, 4):
        feed_server.add(n)
        e = period(m)
        assert e.status == "confirmed", e.reason
        assert e.receipt == f"rcpt-{e.id}"
        assert len(e.items) == n
        assert [c["coverage"] for c in e.coverage] == ["complete"]
    assert Edition.objects.filter(monitor=m, status="confirmed").count() == 3
    counted = Counter(edition_receiver.items())
    assert set(counted) == feed_server.versions()
    assert set(counted.values()) == {1}  # every item version once, at the receiver
    assert DeliveryLedger.objects.filter(monitor=m).count() == 13
    first = SourceScan.objects.filter(monitor=m).order_by("id").first()
    assert first is not None and first.pages == 3  # 7 items, 3 a page: followed the next links


def test_quiet_period_is_suppressed_with_reason_and_complete_coverage(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(2)
    assert period(m).status == "confirmed"
    e = period(m)
    assert e.status == "suppressed"
    assert "quiet" in e.reason
    assert e.coverage[0]["coverage"] == "complete"
    assert SourceScan.objects.get(id=e.scans[0]).coverage == "complete"
    assert len(edition_receiver.accepted) == 1  # nothing sent for the quiet period


def test_quiet_send_policy_sends_an_empty_edition(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver), quiet="send")
    e = period(m)
    assert e.status == "confirmed" and e.items == []
    assert len(edition_receiver.accepted) == 1


def test_429_names_the_source_and_later_items_arrive_later(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(3)
    assert period(m).status == "confirmed"
    cp = MonitorCheckpoint.objects.get(monitor=m).value
    feed_server.add(2)
    feed_server.faults = ["429"]
    e = period(m)
    # An unreadable source never yields "nothing new": the edition names it, and is sent with the gap.
    assert e.coverage[0]["coverage"] == "failed"
    assert "429" in e.coverage[0]["error"]
    assert e.status != "suppressed"
    assert "429" in e.digest
    assert MonitorCheckpoint.objects.get(monitor=m).value == cp  # held
    e = period(m)
    assert e.status == "confirmed" and len(e.items) == 2  # the two that the 429 hid, in a later edition
    assert Counter(edition_receiver.items()) == Counter(dict.fromkeys(feed_server.versions(), 1))


def test_429_on_a_later_page_is_partial_and_keeps_what_was_read(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.page_size = 2
    feed_server.add(2)
    assert period(m).status == "confirmed"
    feed_server.add(5)
    feed_server.faults = [None, "429"]  # type: ignore[list-item]
    e = period(m)
    assert e.coverage[0]["coverage"] == "partial"
    assert len(e.items) == 2  # the first page's items go out; the rest wait for a complete scan
    e = period(m)
    assert e.coverage[0]["coverage"] == "complete" and len(e.items) == 3
    assert Counter(edition_receiver.items()) == Counter(dict.fromkeys(feed_server.versions(), 1))


@pytest.mark.parametrize("fault", ["truncate", "garbage", "auth"])
def test_unreadable_page_is_never_complete(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, fault: str
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(2)
    assert period(m).status == "confirmed"
    feed_server.add(1)
    feed_server.faults = [fault]
    e = period(m)
    assert e.coverage[0]["coverage"] == "failed", e.coverage
    assert e.status != "suppressed"
    e = period(m)
    assert len(e.items) == 1 and e.status == "confirmed"


def test_expired_history_is_partial(session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.page_size = 2
    feed_server.add(2)
    assert period(m).status == "confirmed"
    feed_server.add(6)  # three pages of new items; the archive past page 1 has expired
    feed_server.expire_after = 1
    e = period(m)
    assert e.coverage[0]["coverage"] == "partial"
    assert "410" in e.coverage[0]["error"]
    assert len(e.items) == 2


def test_updated_item_is_a_new_version_and_late_arrival_in_overlap_is_caught(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    first = feed_server.add(3)
    assert period(m).status == "confirmed"
    feed_server.update(first[0].id)
    # A late arrival: published now, dated inside the overlap window before the checkpoint.
    feed_server.add(1, at=feed_server.clock - timedelta(minutes=12))
    e = period(m)
    assert e.status == "confirmed"
    assert {i["id"] for i in e.items} == {first[0].id, "urn:test:item-4"}
    counted = Counter(edition_receiver.items())
    assert set(counted.values()) == {1}
    assert len([k for k in counted if k[0] == first[0].id]) == 2  # two versions, each once


def test_first_run_initial_now_is_an_explicit_baseline(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    feed_server.add(4)
    body = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed_server.url, "initial": "now"}],
        "destination": webhook(edition_receiver),
    }
    m, _ = monitors.create(session.id, body, by="owner")
    e = period(m)
    assert e.status == "suppressed"
    assert "initial" in SourceScan.objects.get(id=e.scans[0]).evidence
    feed_server.add(1)
    assert len(period(m).items) == 1


def test_new_partition_and_changed_query_start_their_own_checkpoint(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(2)
    period(m)
    sources = [*m.sources, {**m.sources[0], "partition": "second"}]
    Monitor.objects.filter(id=m.id).update(sources=sources)
    m.refresh_from_db()
    period(m)
    partitions = set(MonitorCheckpoint.objects.filter(monitor=m).values_list("partition", flat=True))
    assert partitions == {"default", "second"}
    # The new partition read the feed from its start, but its items were delivered already: none twice.
    assert set(Counter(edition_receiver.items()).values()) == {1}


def test_accept_then_drop_is_unknown_and_the_resend_is_one_delivery(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(3)
    edition_receiver.modes = ["drop"]
    e = period(m)
    assert e.status == "unknown", e.reason
    assert not DeliveryLedger.objects.filter(monitor=m).exists()  # no confirmation, no delivered entries
    assert len(edition_receiver.accepted) == 1
    # The next period waits: nothing else is sent while an edition is unknown; it is re-sent first.
    feed_server.add(1)
    settle(m)
    e.refresh_from_db()
    assert e.status == "confirmed" and e.receipt == f"rcpt-{e.id}"
    assert edition_receiver.posts == 2
    assert len(edition_receiver.accepted) == 1  # the same key: one delivery at the receiver
    later = period(m)
    assert later.status == "confirmed" and len(later.items) == 1
    assert Counter(edition_receiver.items()) == Counter(dict.fromkeys(feed_server.versions(), 1))
    # The effect ledger holds it: the first attempt unknown, the host's own rerun (the destination honours
    # the key), the second attempt's receipt; the later edition's one attempt and receipt.
    first = [(x.attempt, x.state, x.idempotency_key) for x in effects.effects(session.id) if x.edition_id == str(e.id)]
    assert first == [(1, "resolved", str(e.id)), (2, "done", str(e.id))]
    [resolved] = Event.objects.filter(session_id=session.id, kind="tool/resolved").values_list("data", flat=True)
    assert resolved["action"] == "rerun" and resolved["by"] == "terret"
    assert [x.state for x in effects.effects(session.id) if x.edition_id == str(later.id)] == ["done"]
    audit = effects.effects_audit(session.id)
    assert audit.ok, audit.problems


def test_200_without_receipt_id_is_not_confirmation(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(1)
    edition_receiver.modes = ["no_id"]
    e = period(m)
    assert e.status == "unknown" and "receipt id" in e.reason
    assert not DeliveryLedger.objects.filter(monitor=m).exists()


def test_unknown_edition_holds_later_editions_until_reconciled(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(1)
    edition_receiver.modes = ["drop", "drop"]
    assert period(m).status == "unknown"
    feed_server.add(1)
    later = period(m)  # the resend drops again: the period's edition is held, its item pending
    assert later.status == "held" and "unknown" in later.reason
    assert MonitorCandidate.objects.filter(monitor=m, status="pending").count() == 1
    settle(m)
    assert period(m).status == "confirmed"
    assert Counter(edition_receiver.items()) == Counter(dict.fromkeys(feed_server.versions(), 1))


def test_failed_before_accepting_hands_items_to_the_next_edition(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(2)
    edition_receiver.modes = ["fail"]
    e = period(m)
    assert e.status == "failed" and "503" in e.reason
    assert MonitorCandidate.objects.filter(monitor=m, status="pending").count() == 2
    nxt = period(m)
    assert nxt.status == "confirmed" and len(nxt.items) == 2


def test_fifty_periods_with_faults(session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver) -> None:
    rnd = random.Random(32)
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.page_size = 3
    for _ in range(50):
        feed_server.add(rnd.randint(0, 4))
        if feed_server.entries and rnd.random() < 0.2:
            feed_server.update(rnd.choice(list(feed_server.entries)))
        feed_server.faults = [rnd.choice([None, None, None, "429", "truncate", "garbage"]) for _ in range(3)]
        edition_receiver.modes = [rnd.choice([None, None, None, "fail", "drop", "no_id"])]
        period(m)
        settle(m)
    counted = Counter(edition_receiver.items())
    assert set(counted.values()) <= {1}, [k for k, v in counted.items() if v > 1]  # never twice
    # What the faults kept back is visible: pending, in an unknown edition, or behind a scan that is not
    # complete (the last scan of the partition says so).
    last = SourceScan.objects.filter(monitor=m).order_by("-id").first()
    assert last is not None
    pending = set(
        MonitorCandidate.objects.filter(monitor=m, status__in=("pending", "assigned")).values_list("item_id", "version")
    )
    missing = [v for v in feed_server.versions() if v not in set(counted) | pending]
    assert not missing or last.coverage != "complete" or Edition.objects.filter(monitor=m, status="unknown").exists()
    # The faults stop: everything arrives, each version once.
    feed_server.faults, edition_receiver.modes = [], []
    for _ in range(3):
        settle(m)
        period(m)
    counted = Counter(edition_receiver.items())
    assert set(counted.values()) == {1}
    assert feed_server.versions() <= set(counted)  # (older versions of updated items were delivered too)
    ledger = set(DeliveryLedger.objects.filter(monitor=m).values_list("item_id", "version"))
    assert ledger == set(counted)  # a delivered entry for exactly what the receiver has
    statuses = Counter(Edition.objects.filter(monitor=m).values_list("status", flat=True))
    assert statuses["confirmed"] > 10 and statuses["unknown"] == 0
    # Every send is in the session's effect ledger, and it holds: one receipt per confirmed or failed edition.
    audit = effects.effects_audit(session.id)
    assert audit.ok, audit.problems
    receipts = Event.objects.filter(session_id=session.id, kind="tool/receipt").values_list("data", flat=True)
    assert sum(1 for r in receipts if not r.get("is_error")) == statuses["confirmed"]
    assert sum(1 for r in receipts if r.get("is_error")) == statuses["failed"]
    assert audit.counts["calls"] == statuses["confirmed"] + statuses["failed"]


def test_email_destination_receipt_is_the_message_id(session: Any, feed_server: FeedServer, mailbox: Any) -> None:
    m = make(session, feed_server, {"kind": "email", "to": ["reader@example.org"]})
    feed_server.add(2)
    e = period(m)
    assert e.status == "confirmed", e.reason
    [message] = mailbox.to("reader@example.org")
    assert message["Message-ID"] == e.receipt
    assert "Title item-1" in message.get_payload()


def test_bad_requests_change_nothing(session: Any, feed_server: FeedServer, settings: Any) -> None:
    good = {
        "schedule": {"every_seconds": 3600},
        "sources": [{"kind": "feed", "url": feed_server.url}],
        "destination": {"kind": "webhook", "url": feed_server.url},
    }
    for bad in (
        {**good, "schedule": {"every_seconds": 1}},
        {**good, "sources": []},
        {**good, "sources": [{"kind": "rss?", "url": feed_server.url}]},
        {**good, "destination": {"kind": "pigeon"}},
        {**good, "quiet": "loud"},
        {**good, "destination": {"kind": "email", "to": ["not an address"]}},
    ):
        with pytest.raises(Exception) as caught:
            monitors.create(session.id, bad, by="owner")
        assert isinstance(caught.value, (InvalidInput,)) or caught.value.__class__.__name__ == "ScheduleLimit"
    settings.TERRET_ALLOW_PRIVATE_HOSTS = []
    with pytest.raises(UnsafeUrl):
        monitors.create(session.id, good, by="owner")
    assert not Monitor.objects.exists()


def test_session_destination_receipt_is_the_event_seq(session: Any, feed_server: FeedServer) -> None:
    m = make(session, feed_server, {"kind": "session"})
    feed_server.add(3)
    e = period(m)
    assert e.status == "confirmed", e.reason
    events = list(Event.objects.filter(session_id=session.id, kind="monitor/edition"))
    assert len(events) == 1 and str(events[0].seq) == e.receipt
    assert events[0].data["edition_id"] == str(e.id) and len(events[0].data["items"]) == 3
    feed_server.add(1)
    period(m)
    assert Event.objects.filter(session_id=session.id, kind="monitor/edition").count() == 2
    assert DeliveryLedger.objects.filter(monitor=m).count() == 4


def test_the_model_writes_only_the_digest(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, fake_llm: Any
) -> None:
    from tests.fakes.fake_llm import Reply

    m = make(session, feed_server, webhook(edition_receiver), digest="model")
    feed_server.add(2)
    fake_llm.script(Reply(text="Two new posts: item 1 and item 2. Also item 99!", usage=(30, 12, 0.001)))
    e = period(m)
    assert e.status == "confirmed" and e.digest_by == "model"
    [request] = fake_llm.requests
    assert "Title item-1" in json.dumps(request["messages"])  # the host handed it the candidates
    [body] = edition_receiver.accepted.values()
    assert body["digest"].startswith("Two new posts")
    # The model's "item 99" is words in the digest, nothing more: the items are the host's.
    assert [i["id"] for i in body["items"]] == ["urn:test:item-1", "urn:test:item-2"]
    used = Event.objects.get(session_id=session.id, kind="usage/recorded", data__purpose="digest")
    assert used.data["usage"]["prompt_tokens"] == 30
    # A model that fails leaves the host's digest, and the edition says why.
    feed_server.add(1)
    fake_llm.script(Reply(status=400))  # permanent: the adapter does not retry it
    e = period(m)
    assert e.status == "confirmed" and e.digest_by.startswith("host (the model failed")
    assert "Title item-3" in e.digest


def test_http_json_source_cursor_since_and_faults(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    source = {
        "kind": "http_json",
        "url": f"{feed_server.base}/items",
        "items": "data.items",
        "next_cursor": "next",
        "cursor_param": "cursor",
        "since_param": "since",
        "overlap_seconds": 300,
    }
    body = {"schedule": {"every_seconds": 3600}, "sources": [source], "destination": webhook(edition_receiver)}
    m, _ = monitors.create(session.id, body, by="owner")
    feed_server.page_size = 2
    feed_server.add(5)
    e = period(m)
    assert e.status == "confirmed" and len(e.items) == 5
    assert SourceScan.objects.get(id=e.scans[0]).pages == 3  # followed the cursor
    assert feed_server.since_asked[0] is None  # first run: the whole list, explicitly
    feed_server.add(2)
    feed_server.faults = ["429"]
    e = period(m)
    assert e.coverage[0]["coverage"] == "failed" and "429" in e.coverage[0]["error"]
    feed_server.faults = [None, "garbage"]  # type: ignore[list-item]
    e = period(m)
    assert e.coverage[0]["coverage"] == "partial" and "not JSON" in e.coverage[0]["error"]
    e = period(m)
    assert e.coverage[0]["coverage"] == "complete"
    # Asked from the checkpoint minus the overlap, never a fixed lookback.
    checkpoint = MonitorCheckpoint.objects.get(monitor=m).value
    assert checkpoint is not None
    assert feed_server.since_asked[-1] is not None
    assert Counter(edition_receiver.items()) == Counter(dict.fromkeys(feed_server.versions(), 1))


def test_a_hold_sends_nothing_and_a_revoked_session_ends_the_monitor(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    from sessions_app.services import operators

    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(2)
    operators.suspend("session", str(session.id), by="ops", reason="incident")
    e = period(m)
    assert e.status == "held" and "held:" in e.reason and "2 item(s) stay pending" in e.reason
    assert e.coverage[0]["coverage"] == "complete"  # collection went on
    assert edition_receiver.posts == 0
    operators.resume("session", str(session.id), by="ops")
    e = period(m)
    assert e.status == "confirmed" and len(e.items) == 2
    operators.revoke(session.id, by="ops")
    feed_server.add(1)
    Monitor.objects.filter(id=m.id).update(due_at=timezone.now() - timedelta(seconds=1))
    run.tick()
    m.refresh_from_db()
    assert m.status == "cancelled" and "revoked" in m.status_reason
    assert edition_receiver.posts == 1


class DroppingBox:
    """An SMTP handler that takes the message and then cuts the connection
    before its 250: the sender cannot tell whether it was accepted."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
        self.messages.append(envelope.content)
        server.transport.close()
        return "250 OK"


def test_email_fail_before_and_after_accepting(
    session: Any, owner: Any, feed_server: FeedServer, mailbox: Any, settings: Any
) -> None:
    from aiosmtpd.controller import Controller

    from tests.sessions_app.notify.conftest import free_port

    m = make(session, feed_server, {"kind": "email", "to": ["reader@example.org"]})
    real = settings.MAILERS
    # Before accepting: nothing listens. The edition failed, its items wait for the next.
    settings.MAILERS = {"default": {**real["default"], "OPTIONS": {**real["default"]["OPTIONS"], "port": free_port()}}}
    feed_server.add(2)
    e = period(m)
    assert e.status == "failed" and "not sent" in e.reason
    assert MonitorCandidate.objects.filter(monitor=m, status="pending").count() == 2
    # After accepting: the message is in, the answer is lost. Unknown, and no idempotency key for SMTP:
    # it is not re-sent; later periods are held until an operator decides.
    dropping = DroppingBox()
    port = free_port()
    controller = Controller(dropping, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        settings.MAILERS = {"default": {**real["default"], "OPTIONS": {**real["default"]["OPTIONS"], "port": port}}}
        e = period(m)
        assert e.status == "unknown", e.reason
        assert len(dropping.messages) == 1
    finally:
        controller.stop()
    settings.MAILERS = real
    feed_server.add(1)
    settle(m)
    held = period(m)
    assert held.status == "held" and "1 item(s) stay pending" in held.reason
    assert not mailbox.messages  # nothing sent while the unknown one waits
    assert not DeliveryLedger.objects.filter(monitor=m).exists()
    # An unknown effect of the session's ledger that nobody re-sends (SMTP has no idempotency key).
    [pending] = [x for x in effects.effects(session.id) if x.state == "unknown"]
    assert pending.edition_id == str(e.id) and pending.replay == "never"
    # The operator looked at the mailbox: it arrived. Its items are delivered; the next period sends the rest.
    monitors.resolve_edition(m, e.id, "done", receipt="<terret-edition@example>", by="ops")
    e.refresh_from_db()
    assert e.status == "confirmed" and DeliveryLedger.objects.filter(monitor=m).count() == 2
    nxt = period(m)
    assert nxt.status == "confirmed" and len(nxt.items) == 1
    assert len(mailbox.messages) == 1
    assert effects.effects_audit(session.id).ok


def test_a_send_cut_off_mid_flight_is_reconciled_by_its_replay_policy(
    session: Any, feed_server: FeedServer, mailbox: Any, monkeypatch: Any
) -> None:
    """The worker stops inside the send (here: the send raises, so the intent stays without an outcome).
    An email may not be re-sent blindly: the next tick marks the attempt unknown (tool/unknown), sends
    nothing, and the session's own turns are not held by it. The operator answers `failed` through the
    effect resolution: its items go to the next edition, sent once."""
    from sessions_app.models import Session
    from sessions_app.monitors.destinations.email import Email
    from sessions_app.services import effects as effect_services

    m = make(session, feed_server, {"kind": "email", "to": ["reader@example.org"]})
    feed_server.add(2)

    def dies(self: Any, config: Any, p: Any) -> Any:
        raise RuntimeError("the worker stopped here")

    with monkeypatch.context() as patch:
        patch.setattr(Email, "send", dies)
        e = period(m)
    assert e.status == "posting"  # the intent, no outcome
    [attempt] = effects.effects(session.id)
    assert attempt.state == "in_flight" and attempt.replay == "never"
    assert effects.effects_audit(session.id).ok  # a host attempt in flight belongs to no turn
    Monitor.objects.filter(id=m.id).update(lease_until=None)
    run.tick()
    e.refresh_from_db()
    assert e.status == "unknown" and "may not be re-run blindly" in e.reason
    assert not mailbox.messages
    s = Session.objects.get(id=session.id)
    assert s.unresolved_effects == 1 and s.unknown_effects == 0 and s.status == "idle"
    effect_services.resolve(session.id, f"edition-{e.id}", "failed", reason="not in the mailbox", by="ops")
    e.refresh_from_db()
    assert e.status == "failed" and "resolved failed by ops: not in the mailbox" in e.reason
    assert MonitorCandidate.objects.filter(monitor=m, status="pending").count() == 2
    nxt = period(m)
    assert nxt.status == "confirmed" and len(nxt.items) == 2 and len(mailbox.messages) == 1
    audit = effects.effects_audit(session.id)
    assert audit.ok, audit.problems
    assert audit.counts == {"resolved": 1, "done": 1, "calls": 2}
    assert Session.objects.get(id=session.id).unresolved_effects == 0


def test_mcp_source_pages_by_continuation(
    session: Any, profile: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, tmp_path: Any
) -> None:
    from tests.fakes.items_mcp_server import items_server
    from tests.helpers import edit_profile

    items_file = tmp_path / "items.json"

    def publish_items(n: int) -> list[dict[str, Any]]:
        rows = [
            {"id": f"i{k}", "title": f"Item {k}", "updated_at": f"2026-01-01T00:{k:02d}:00+00:00"}
            for k in range(n, 0, -1)
        ]
        items_file.write_text(json.dumps(rows))
        return rows

    edit_profile(profile, mcp_servers=[items_server(items_file)])
    source = {"kind": "mcp", "server": "items", "tool": "list_items", "cursor_arg": "cursor", "next_cursor": "next"}
    body = {"schedule": {"every_seconds": 3600}, "sources": [source], "destination": webhook(edition_receiver)}
    m, _ = monitors.create(session.id, body, by="owner")
    publish_items(5)
    e = period(m)
    assert e.status == "confirmed" and len(e.items) == 5, (e.coverage, e.reason)
    assert SourceScan.objects.get(id=e.scans[0]).pages == 3  # followed the continuation
    publish_items(7)
    (tmp_path / "items.json.fail").write_text("1")
    e = period(m)
    assert e.coverage[0]["coverage"] == "failed" and "429" in e.coverage[0]["error"]
    e = period(m)
    assert e.coverage[0]["coverage"] == "complete" and {i["id"] for i in e.items} == {"i6", "i7"}
    assert set(Counter(edition_receiver.items()).values()) == {1}
    assert len(edition_receiver.items()) == 7


def test_other_partitions_progress_when_one_fails(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver
) -> None:
    sources = [
        {"kind": "feed", "url": feed_server.url, "partition": "a"},
        {"kind": "feed", "url": feed_server.url + "?lang=b", "partition": "b"},
    ]
    body = {"schedule": {"every_seconds": 3600}, "sources": sources, "destination": webhook(edition_receiver)}
    m, _ = monitors.create(session.id, body, by="owner")
    feed_server.add(2)
    period(m)
    before = dict(MonitorCheckpoint.objects.filter(monitor=m).values_list("partition", "value"))
    feed_server.add(1)
    feed_server.faults = ["429"]  # the first partition's scan
    e = period(m)
    assert [(c["partition"], c["coverage"]) for c in e.coverage] == [("a", "failed"), ("b", "complete")]
    after = dict(MonitorCheckpoint.objects.filter(monitor=m).values_list("partition", "value"))
    assert after["a"] == before["a"] and after["b"] > before["b"]
    assert e.status == "confirmed" and len(e.items) == 1  # what b found goes out now
    coverage = {c["partition"]: c["coverage"] for c in monitors.as_json(m)["coverage"]}
    assert coverage == {"a": "failed", "b": "complete"}


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
def test_the_embedded_clock_runs_monitors_in_process(
    session: Any, feed_server: FeedServer, edition_receiver: EditionReceiver, settings: Any
) -> None:
    """The in-process worker's own clock thread (runtime/schedules.py, the apps' clocks) runs the
    monitor: no Celery, the embedded path."""
    import time

    from sessions_app.runtime.schedules import start_clock, stop_clock

    settings.TERRET_WORKER = "inprocess"
    settings.TERRET_SCHEDULE_POLL_SECONDS = 0.05
    m = make(session, feed_server, webhook(edition_receiver))
    feed_server.add(3)
    stop_clock()  # one an earlier test may have left running on its own database
    start_clock(lambda: settings.TERRET_WORKER == "inprocess")
    try:
        Monitor.objects.filter(id=m.id).update(due_at=timezone.now() - timedelta(seconds=1))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not Edition.objects.filter(monitor=m, status="confirmed").exists():
            time.sleep(0.05)
    finally:
        stop_clock()
    assert Edition.objects.filter(monitor=m, status="confirmed").count() == 1
    assert Counter(edition_receiver.items()) == Counter(dict.fromkeys(feed_server.versions(), 1))
