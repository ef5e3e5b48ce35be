"""Issue 29: the API's events page and the chat page show stored rows of an
older event version lifted to the catalogue's version (log.reads: one read
path for every door). PostgreSQL and SQLite."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import Session
from tests.helpers import client_for
from tests.sessions_app.lifted import LIFTED_TEXT, LIFTED_UPGRADE, OLD_TEXT, store_old_rows, user_message_v2

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]
_ = user_message_v2


def test_the_events_page_lifts_older_rows(session: Session, owner: Any, user_message_v2: None) -> None:
    said, moved = store_old_rows(session.id)
    page = client_for(owner).get(f"/api/sessions/{session.id}/events?after=0").json()
    by_seq = {e["seq"]: e for e in page["events"]}
    assert by_seq[said]["data"] == {"text": LIFTED_TEXT}
    assert by_seq[moved]["data"] == LIFTED_UPGRADE


def test_the_chat_page_lifts_older_rows(session: Session, owner: Any, user_message_v2: None) -> None:
    store_old_rows(session.id)
    html = client_for(owner).get(f"/sessions/{session.id}/").content.decode()
    assert LIFTED_TEXT in html
    assert OLD_TEXT not in html  # the stored text, unlifted, is nowhere
