"""Owned tasks over the JSON API: GET /api/sessions/{id}/tasks, GET
/api/tasks/{id} and POST /api/tasks/{id}/cancel, through the verbs in
actions/ and the one access rule (a second user sees nothing of the first's
tasks: 404 unknown_task, as if absent); a child session's detail names its
parent, the parent's budget its children's spend; OpenAPI describes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Task
from sessions_app.runtime.drive import drive
from sessions_app.runtime.owned import supervise
from tests.fakes.fake_llm import Reply
from tests.helpers import events
from tests.sessions_app.apiutil import bearer, call, token_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("manual_worker")]


@pytest.fixture
def session(owner: Any) -> Any:
    AgentProfile.objects.create(name="helper", roles={"main": "test/model"})
    profile = AgentProfile.objects.create(
        name="tasks-api",
        roles={"main": "test/model"},
        builtin_tools=["task.start", "task.status", "task.cancel"],
        allow_floor=["*"],
        command_allow=["sh"],
        approvals={"task.start": "never"},
    )
    return services.create_session(owner, profile)


def started(fake_llm: Any, session: Any, args: dict[str, Any]) -> Task:
    fake_llm.script(Reply(tool_calls=[("task.start", {**args, "background": True})]), Reply(text="ok"))
    services.run_turn(session.id, "start it")
    drive(session.id)
    return Task.objects.filter(session=session).order_by("-created_at").first()


def test_a_sessions_tasks_listed_read_and_cancelled(client: Any, auth: Any, fake_llm: Any, session: Any) -> None:
    task = started(fake_llm, session, {"kind": "command", "argv": ["sh", "-c", "echo hi"]})
    listed = call(client, "GET", f"/api/sessions/{session.id}/tasks", **auth)
    assert listed.status_code == 200
    (shown,) = listed.data["tasks"]
    assert shown["id"] == str(task.id) and shown["kind"] == "command" and shown["phase"] == "pending"
    assert shown["owner"] == {"session_id": str(session.id), "turn_seq": task.turn_seq}
    assert shown["background"] is True and shown["argv"] == ["sh", "-c", "echo hi"]

    supervise.run_task(str(task.id))
    one = call(client, "GET", f"/api/tasks/{task.id}", **auth)
    assert one.status_code == 200
    assert one.data["phase"] == "done" and one.data["outcome"] == {"exit_code": 0, "output": "hi\n"}
    assert one.data["ended_at"]

    live = started(fake_llm, session, {"kind": "command", "argv": ["sh", "-c", "sleep 30"]})
    cancelled = call(client, "POST", f"/api/tasks/{live.id}/cancel", **auth)
    assert cancelled.status_code == 200 and cancelled.data["aborting"] is True
    assert supervise.run_task(str(live.id)) == "cancelled"  # pending: its claim settles it at once, nothing runs
    assert call(client, "GET", f"/api/tasks/{live.id}", **auth).data["phase"] == "cancelled"
    assert len(events(session, "task/cancelled")) == 1


def test_a_second_user_sees_nothing_of_the_first_users_tasks(
    client: Any, fake_llm: Any, session: Any, make_user: Any
) -> None:
    task = started(fake_llm, session, {"kind": "command", "argv": ["sh", "-c", "sleep 30"]})
    other = bearer(token_for(make_user("other")))
    for method, path in (
        ("GET", f"/api/sessions/{session.id}/tasks"),
        ("GET", f"/api/tasks/{task.id}"),
        ("POST", f"/api/tasks/{task.id}/cancel"),
    ):
        response = call(client, method, path, **other)
        assert response.status_code == 404, (method, path)
        assert response.data["code"] in ("unknown_session", "unknown_task")
        assert "sleep" not in json.dumps(response.data)  # nothing of the task leaks
    assert Task.objects.get(id=task.id).abort_requested_at is None  # nothing changed
    assert call(client, "GET", "/api/tasks/not-a-uuid", **other).data["code"] == "unknown_task"


def test_a_child_names_its_parent_and_the_parent_budget_counts_the_childs_spend(
    client: Any, auth: Any, fake_llm: Any, session: Any
) -> None:
    task = started(fake_llm, session, {"kind": "subagent", "profile": "helper", "prompt": "hello"})
    child_id = Task.objects.get(id=task.id).child_session_id
    fake_llm.script(Reply(text="hi", usage=(100, 50, 0.25)))
    supervise.run_task(str(task.id))
    drive(child_id)
    child = call(client, "GET", f"/api/sessions/{child_id}", **auth)
    assert child.data["parent"] == {"session_id": str(session.id), "task_id": str(task.id)}
    assert call(client, "GET", f"/api/sessions/{session.id}", **auth).data["parent"] is None
    budget = call(client, "GET", f"/api/sessions/{session.id}/budget", **auth).data
    assert budget["spent"]["children"] == {"cost_usd": 0.25, "tokens": 150}
    # In /lg/, the subagent is a thread whose metadata names its parent thread.
    token = auth["HTTP_AUTHORIZATION"].split()[1]
    thread = client.get(f"/lg/threads/{child_id}", HTTP_X_API_KEY=token).json()
    assert thread["metadata"]["parent_thread_id"] == str(session.id)
    assert thread["metadata"]["parent_task_id"] == str(task.id)
    assert "parent_thread_id" not in client.get(f"/lg/threads/{session.id}", HTTP_X_API_KEY=token).json()["metadata"]


def test_the_openapi_document_describes_tasks(client: Any) -> None:
    doc = client.get("/api/openapi.json").json()
    assert {"/api/sessions/{session_id}/tasks", "/api/tasks/{task_id}", "/api/tasks/{task_id}/cancel"} <= set(
        doc["paths"]
    )
    task = doc["components"]["schemas"]["TaskOut"]["properties"]
    assert {"id", "kind", "phase", "background", "owner", "child_session", "started_at", "ended_at", "outcome"} <= set(
        task
    )
    assert "waiting_task" in doc["components"]["schemas"]["SessionOut"]["properties"]["status"]["enum"]
