"""Issue 27, point 6, at the LangGraph door: text no column can hold (NUL, a
lone surrogate) in a search filter is a 400 with a code, never a 500; in a
run's input the log refuses it (invalid_payload, a TerretError every door
maps) and nothing is appended."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from sessions_app.models import Event
from tests.sessions_app.lg.conftest import PROFILE

pytestmark = pytest.mark.django_db

# As a client sends it: JSON's \u0000 and a lone \ud800 escape.
NUL, LONE = "a\x00b", "a\ud800"


def post(client: Client, url: str, body: Any, token: str) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json", HTTP_X_API_KEY=token)


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/lg/threads/search", {"metadata": {"graph_id": NUL}}, "metadata.graph_id must not contain NUL"),
        ("/lg/threads/search", {"metadata": {"graph_id": LONE}}, "metadata.graph_id must not contain lone surrogates"),
        ("/lg/assistants/search", {"graph_id": NUL}, "graph_id must not contain NUL"),
        ("/lg/assistants/search", {"name": LONE}, "name must not contain lone surrogates"),
    ],
)
def test_a_search_filter_no_column_holds_is_a_400(
    client: Client, lg_token: str, path: str, body: Any, named: str
) -> None:
    answer = post(client, path, body, lg_token)
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_input"), answer.content
    assert named in answer.json()["message"]


@pytest.mark.usefixtures("manual_worker")
def test_a_run_whose_input_the_log_refuses_is_a_400_and_appends_nothing(client: Client, lg_token: str) -> None:
    thread = post(client, "/lg/threads", {"metadata": {"graph_id": PROFILE}}, lg_token).json()["thread_id"]
    before = Event.objects.count()
    answer = post(
        client, f"/lg/threads/{thread}/runs", {"assistant_id": PROFILE, "input": {"messages": [LONE]}}, lg_token
    )
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_payload"), answer.content
    assert Event.objects.count() == before
