"""The issue's "done when": a new approval, parked by a real worker's turn,
sends exactly one email to each reviewer and one signed webhook, and a
kill -9 of the sender mid-delivery still gives exactly one of each.

The sender is killed at each failpoint of sessions_app/notify/delivery.py:
`notify_claimed` (claimed, nothing sent yet: a second worker sends it) and
`notify_sent` (sent, not yet marked: it must not be sent again).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Notification, PersonNotifications, Session
from tests.fakes.fake_llm import Reply
from tests.helpers import wait_for
from tests.sessions_app.notify.conftest import SECRET, Mailbox, Receiver

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def sender_env(mailbox: Mailbox, **extra: str) -> dict[str, str]:
    return {
        "EMAIL_HOST": mailbox.host,
        "EMAIL_PORT": str(mailbox.port),
        "TERRET_ALLOW_PRIVATE_HOSTS": "127.0.0.1",
        "TERRET_NOTIFY_LEASE_SECONDS": "2",
        "TERRET_NOTIFY_POLL_SECONDS": "0.3",
        **extra,
    }


def approval_world(fake_llm: Any, make_user: Any, make_reviewer: Any, receiver: Receiver) -> Session:
    make_user("boss", email="boss@example.com", is_staff=True)
    rev = make_reviewer("rev", email="rev@example.com")
    PersonNotifications.objects.create(user=rev, webhook_url=receiver.url, webhook_secret=SECRET)
    profile = AgentProfile.objects.create(
        name="w", roles={"main": "test/model"}, builtin_tools=["workspace.write"], allow_floor=["workspace.*"]
    )
    fake_llm.script(Reply(tool_calls=[("workspace.write", {"path": "a.txt", "content": "x"})]), Reply(text="ok"))
    return services.create_session(make_user("owner", email="owner@example.com"), profile)


def counts(mailbox: Mailbox, receiver: Receiver) -> tuple[int, int, int]:
    return len(mailbox.to("boss@example.com")), len(mailbox.to("rev@example.com")), len(receiver.deliveries)


def statuses(session: Session) -> list[str]:
    return sorted(Notification.objects.filter(session=session).values_list("status", flat=True))


def test_a_new_approval_is_told_once_by_email_and_webhook(
    start_worker: Any, fake_llm: Any, make_user: Any, make_reviewer: Any, mailbox: Mailbox, receiver: Receiver,
    settings: Any, tmp_path: Any,
) -> None:  # fmt: skip
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    session = approval_world(fake_llm, make_user, make_reviewer, receiver)
    start_worker(name="sender", **sender_env(mailbox))
    services.run_turn(session.id, "write it")
    wait_for(lambda: statuses(session) == ["sent"] * 3, 60, "three notifications sent")
    time.sleep(1.0)  # the sender thread's further rounds send nothing more
    assert counts(mailbox, receiver) == (1, 1, 1)
    [hook] = receiver.deliveries
    assert hook.signed_with(SECRET) and hook.json()["event"] == "approval_requested"
    assert hook.json()["session_id"] == str(session.id) and hook.json()["kind"] == "approval/requested"


@pytest.mark.parametrize("point", ["notify_claimed", "notify_sent"])
def test_a_kill_9_mid_delivery_still_gives_exactly_one_of_each(
    point: str, start_worker: Any, fake_llm: Any, make_user: Any, make_reviewer: Any, mailbox: Mailbox,
    receiver: Receiver, settings: Any, tmp_path: Any,
) -> None:  # fmt: skip
    settings.TERRET_WORKSPACE_ROOT = tmp_path
    session = approval_world(fake_llm, make_user, make_reviewer, receiver)
    first = start_worker(
        name="doomed", **sender_env(mailbox, TERRET_FAILPOINTS=f"{point}:email=120,{point}:webhook=120")
    )
    services.run_turn(session.id, "write it")
    if point == "notify_claimed":
        wait_for(lambda: statuses(session) == ["claimed"] * 3, 60, "the first worker to claim all three")
        time.sleep(0.5)
        assert counts(mailbox, receiver) == (0, 0, 0)
    else:
        wait_for(lambda: counts(mailbox, receiver) == (1, 1, 1), 60, "the first worker to send all three")
        time.sleep(0.5)
        assert statuses(session) == ["sending"] * 3  # sent, and not marked sent: the window a crash hits
    first.kill()

    start_worker(name="survivor", **sender_env(mailbox))
    final = "sent" if point == "notify_claimed" else "unknown"
    wait_for(lambda: statuses(session) == [final] * 3, 60, f"the survivor to leave them {final}")
    time.sleep(2.0)  # several more rounds of the survivor's sender: nothing is resent
    assert counts(mailbox, receiver) == (1, 1, 1)
    assert receiver.deliveries[0].signed_with(SECRET)
