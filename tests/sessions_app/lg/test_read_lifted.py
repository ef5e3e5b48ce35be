"""Issue 29: /lg/'s thread state and history fold stored rows of an older
event version lifted to the catalogue's version."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from tests.sessions_app.lg.conftest import PROFILE
from tests.sessions_app.lifted import LIFTED_TEXT, store_old_rows, user_message_v2

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]
_ = user_message_v2


def post(client: Client, url: str, body: Any, token: str) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json", HTTP_X_API_KEY=token)


def test_state_and_history_read_older_rows_lifted(client: Client, lg_token: str, user_message_v2: None) -> None:
    thread = post(client, "/lg/threads", {"metadata": {"graph_id": PROFILE}}, lg_token).json()["thread_id"]
    store_old_rows(thread)
    state = client.get(f"/lg/threads/{thread}/state", HTTP_X_API_KEY=lg_token).json()
    humans = [m["content"] for m in state["values"]["messages"] if m["type"] == "human"]
    assert humans == [LIFTED_TEXT]
    history = post(client, f"/lg/threads/{thread}/history", {"limit": 10}, lg_token).json()
    assert [m["content"] for m in history[0]["values"]["messages"] if m["type"] == "human"] == [LIFTED_TEXT]
