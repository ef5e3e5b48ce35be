"""The documents API: GET /api/sessions/{id}/documents, GET and PUT
/api/sessions/{id}/documents/{name} (docs/protocol.md). Who may do what is
the access matrix's (tests/sessions_app/actions/test_access_matrix.py);
here: the shapes, versions, binary content, conflicts, bounds, and that an
owner's write is the agent's world (a turn's workspace.read reads it)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.test import Client

from sessions_app.models import AgentProfile, Event, Session
from sessions_app.runtime.drive import drive
from sessions_app.services import operators, run_turn
from tests.fakes.fake_llm import Reply
from tests.helpers import edit_profile
from tests.sessions_app.apiutil import bearer, make_reviewer, session_url, token_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


def put(client: Client, session: Session, name: str, body: Any, headers: dict[str, Any]) -> Any:
    url = session_url(session, f"/documents/{name}")
    return client.put(url, data=json.dumps(body), content_type="application/json", **headers)


def head(session: Session) -> int:
    return int(Session.objects.values_list("last_seq", flat=True).get(id=session.id))


def test_write_list_and_read_documents(client: Client, session: Session, auth: dict[str, Any]) -> None:
    first = put(client, session, "notes/plan.md", {"content": "step 1"}, auth)
    assert first.status_code == 200, first.content
    assert first.json() | {"sha256": "-", "seq": 0} == {
        "name": "notes/plan.md",
        "kind": "file",
        "scope": "conversation",
        "incarnation": 1,
        "version": 1,
        "size": 6,
        "sha256": "-",
        "seq": 0,
        "schema": None,
        "schema_version": None,
    }
    second = put(client, session, "notes/plan.md", {"content": "step 1\nstep 2"}, auth).json()
    assert second["version"] == 2
    (written,) = Event.objects.filter(session=session, kind="document/written", seq=second["seq"])
    assert written.data["by"] == "owner" and written.data["version"] == 2
    listed = client.get(session_url(session, "/documents"), **auth).json()
    assert [(d["name"], d["version"], d["size"], d["incarnation"]) for d in listed["documents"]] == [
        ("notes/plan.md", 2, 13, 1)
    ]
    assert listed["truncated"] is False
    now = client.get(session_url(session, "/documents/notes/plan.md"), **auth).json()
    assert (now["content"], now["encoding"], now["version"]) == ("step 1\nstep 2", "utf-8", 2)
    then = client.get(session_url(session, "/documents/notes/plan.md?version=1"), **auth).json()
    assert (then["content"], then["version"]) == ("step 1", 1)
    missing = client.get(session_url(session, "/documents/notes/plan.md?version=3"), **auth)
    assert missing.status_code == 404 and missing.json()["code"] == "unknown_document"
    assert client.get(session_url(session, "/documents/nothing"), **auth).json()["code"] == "unknown_document"


def test_binary_content_round_trips_as_base64(client: Client, session: Session, auth: dict[str, Any]) -> None:
    raw = bytes(range(256))
    body = {"content": base64.b64encode(raw).decode(), "encoding": "base64", "kind": "blob"}
    assert put(client, session, "data.bin", body, auth).status_code == 200
    got = client.get(session_url(session, "/documents/data.bin"), **auth).json()
    assert got["encoding"] == "base64" and base64.b64decode(got["content"]) == raw and got["kind"] == "blob"
    bad = put(client, session, "data.bin", {"content": "!!", "encoding": "base64"}, auth)
    assert bad.status_code == 400 and "base64" in bad.json()["message"]


def test_refusals_write_nothing(client: Client, session: Session, auth: dict[str, Any], owner: Any) -> None:
    made = put(client, session, "a.txt", {"content": "one"}, auth).json()
    before = head(session)
    stale = put(client, session, "a.txt", {"content": "x", "incarnation": 1, "version": made["version"] + 1}, auth)
    assert stale.status_code == 409 and stale.json()["code"] == "document_conflict"
    edit_profile(AgentProfile.objects.get(id=session.profile_id), max_document_bytes=4)
    big = put(client, session, "a.txt", {"content": "12345"}, auth)
    assert big.status_code == 413 and "max_document_bytes" in big.json()["message"]
    escape = put(client, session, "..%2Fescape", {"content": "x"}, auth)
    assert escape.status_code in (400, 404)
    unknown_field = put(client, session, "a.txt", {"content": "x", "mode": "append"}, auth)
    assert unknown_field.status_code == 400
    reviewer = make_reviewer(type(owner).objects.create_user("rev", password="pw"))
    as_reviewer = put(client, session, "a.txt", {"content": "x"}, bearer(token_for(reviewer)))
    assert as_reviewer.status_code == 403
    assert client.get(session_url(session, "/documents/a.txt"), **bearer(token_for(reviewer))).status_code == 200
    assert head(session) == before


def test_a_revoked_session_takes_no_write(client: Client, session: Session, auth: dict[str, Any]) -> None:
    """A file is input the agent reads on its next turn: a revoked session
    takes none, through the API as through the chat page's upload."""
    operators.revoke(session.id, by="staff", reason="test")
    before = head(session)
    refused = put(client, session, "a.txt", {"content": "x"}, auth)
    assert refused.status_code == 409 and refused.json()["code"] == "session_revoked"
    assert head(session) == before
    operators.restore(session.id, by="staff")
    assert put(client, session, "a.txt", {"content": "x"}, auth).status_code == 200


def test_an_owners_write_is_what_the_agents_next_turn_reads(
    client: Client, session: Session, auth: dict[str, Any], fake_llm: Any, profile: AgentProfile
) -> None:
    session.profile = profile
    session.save(update_fields=["profile"])
    assert put(client, session, "brief.txt", {"content": "from the owner"}, auth).status_code == 200
    fake_llm.script(Reply(tool_calls=[("workspace.read", {"path": "brief.txt"})]), Reply(text="read it"))
    run_turn(session.id, "read the brief")
    assert drive(session.id) == "ended"
    (result,) = Event.objects.filter(session=session, kind="tool/result").values_list("data", flat=True)
    assert result["content"] == "from the owner" and not result["is_error"]
    assert len(fake_llm.requests) == 2


def test_openapi_documents_the_documents_api(client: Client) -> None:
    spec = client.get("/api/openapi.json").json()
    one = spec["paths"]["/api/sessions/{session_id}/documents/{name}"]
    assert set(one) == {"get", "put"}
    assert {"200", "404"} <= set(one["get"]["responses"])
    assert {"200", "409", "413", "422"} <= set(one["put"]["responses"])
    assert "get" in spec["paths"]["/api/sessions/{session_id}/documents"]
