"""The approval pages: queue, inline partial, and the verdict form, with and
without htmx."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals_app.selectors import pending
from sessions_app import log
from sessions_app.models import Session
from tests.approvals_app.conftest import count, events, park

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("manual_worker")]

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def rclient(client: Client, reviewer: Any) -> Client:
    client.force_login(reviewer)
    return client


def decide_url(session: Session) -> str:
    return f"/approvals/sessions/{session.id}/decide/"


def test_queue_lists_tool_args_title_and_age(rclient: Client, session: Session, make_user: Any, profile: Any) -> None:
    from sessions_app import services

    Session.objects.filter(id=session.id).update(title="Refactor the parser")
    park(session.id, "c1", args={"path": "notes/<b>.txt", "content": "é"})
    other = services.create_session(make_user("someone"), profile)
    park(other.id, "c2", name="workspace.write", args={"path": "z.txt", "content": "z"})
    response = rclient.get("/approvals/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Refactor the parser" in html and "Untitled session" in html
    # pretty-printed (indented, one key per line) and escaped
    assert "\n  &quot;path&quot;: &quot;notes/&lt;b&gt;.txt&quot;\n" in html and "<b>" not in html
    assert html.count('name="verdict" value="approve"') == 2
    assert 'ws-connect="/ws/approvals/"' in html
    assert "<time datetime=" in html
    # oldest first
    assert html.index('data-call-id="c1"') < html.index('data-call-id="c2"')


def test_queue_fragment_is_the_queue_alone(rclient: Client, session: Session) -> None:
    park(session.id)
    response = rclient.get("/approvals/queue/")
    html = response.content.decode()
    assert response.status_code == 200 and html.lstrip().startswith('<div id="approval-queue"')
    assert "<html" not in html


def test_empty_queue(rclient: Client, session: Session) -> None:
    assert "Nothing is waiting for approval." in rclient.get("/approvals/").content.decode()


def test_decide_without_js_redirects_with_a_message(rclient: Client, session: Session) -> None:
    seq = park(session.id)
    response = rclient.post(
        decide_url(session), {"call_id": "c1", "seq": seq, "verdict": "deny", "reason": "no", "from": "queue"}
    )
    assert response.status_code == 302 and response["Location"] == "/approvals/"
    [verdict] = events(session, "approval/resolved")
    assert {k: v for k, v in verdict.items() if k != "grounds"} == {
        "call_id": "c1",
        "verdict": "deny",
        "reason": "no",
        "by": "rev",
    }
    page = rclient.get("/approvals/").content.decode()
    assert "Denied." in page and "Nothing is waiting" in page
    # Second click, no JS: a clear message, nothing appended.
    before = count(session)
    response = rclient.post(decide_url(session), {"call_id": "c1", "seq": seq, "verdict": "approve"}, follow=True)
    assert "already decided (deny by rev)" in response.content.decode()
    assert count(session) == before


def test_decide_with_htmx_swaps_the_fragment(rclient: Client, session: Session, make_reviewer: Any) -> None:
    seq = park(session.id)
    response = rclient.post(decide_url(session), {"call_id": "c1", "seq": seq, "verdict": "approve"}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and html.lstrip().startswith('<div id="approval-queue"')
    assert "Approved." in html and "X-Terret-Error" not in response
    # The other reviewer clicked at the same time on a stale page.
    late = Client()
    late.force_login(make_reviewer("late"))
    before = count(session)
    response = late.post(decide_url(session), {"call_id": "c1", "seq": seq, "verdict": "deny"}, **HTMX)
    assert response.status_code == 200 and response["X-Terret-Error"] == "already_decided"
    assert 'role="alert"' in response.content.decode() and "already decided" in response.content.decode()
    assert count(session) == before


@pytest.mark.parametrize(
    "post, code",
    [
        ({"call_id": "nope", "verdict": "approve"}, "unknown_call"),
        ({"call_id": "c1", "verdict": "maybe"}, "invalid_input"),
        ({"call_id": "c1", "verdict": "approve", "seq": "x"}, "invalid_input"),
        ({"verdict": "approve"}, "invalid_input"),
    ],
)
def test_bad_decisions_append_nothing(rclient: Client, session: Session, post: dict[str, str], code: str) -> None:
    park(session.id)
    before = count(session)
    response = rclient.post(decide_url(session), post, **HTMX)
    assert response["X-Terret-Error"] == code
    assert count(session) == before and len(pending(session.id)) == 1


def test_decision_for_a_closed_turn(rclient: Client, session: Session) -> None:
    seq = park(session.id)
    log.append(session.id, "turn/end", {"status": "failed"})
    response = rclient.post(decide_url(session), {"call_id": "c1", "seq": seq, "verdict": "approve"}, **HTMX)
    assert response["X-Terret-Error"] == "turn_closed"


def test_inline_fragment_for_the_session_page(rclient: Client, session: Session) -> None:
    park(session.id)
    response = rclient.get(f"/approvals/sessions/{session.id}/")
    html = response.content.decode()
    assert response.status_code == 200
    assert f'id="approvals-inline-{session.id.hex}"' in html and "Waiting for approval" in html
    assert 'name="from" value="inline"' in html
    assert f'name="next" value="/sessions/{session.id}/"' in html  # no-JS: back to the session page
    assert "csrfmiddlewaretoken" in html


def test_inline_verdict_returns_the_inline_fragment(rclient: Client, session: Session) -> None:
    seq = park(session.id)
    post = {"call_id": "c1", "seq": seq, "verdict": "approve", "from": "inline", "next": f"/sessions/{session.id}/"}
    response = rclient.post(decide_url(session), post, **HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith(f'<div id="approvals-inline-{session.id.hex}"') and "Approved." in html
    # Without JS it returns to the session page; a foreign `next` is ignored.
    seq2 = park(session.id, "c2", new_turn=False)
    post = {"call_id": "c2", "seq": seq2, "verdict": "approve", "from": "inline", "next": "https://evil.example/"}
    assert rclient.post(decide_url(session), post)["Location"] == "/approvals/"


def test_owner_sees_inline_calls_but_no_forms(client: Client, session: Session) -> None:
    park(session.id)
    client.force_login(session.owner)
    html = client.get(f"/approvals/sessions/{session.id}/").content.decode()
    assert "workspace.write" in html and "Waiting for a reviewer." in html and 'name="verdict"' not in html


def test_session_page_includes_the_inline_partial(rclient: Client, session: Session) -> None:
    park(session.id)
    html = rclient.get(f"/sessions/{session.id}/").content.decode()
    assert f'id="approvals-inline-{session.id.hex}"' in html
    assert 'name="verdict" value="approve"' in html and "data-verdict" not in html


def test_forms_carry_csrf_and_work_with_enforced_csrf(session: Session, reviewer: Any) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(reviewer)
    seq = park(session.id)
    assert strict.post(decide_url(session), {"call_id": "c1", "seq": seq, "verdict": "approve"}).status_code == 403
    html = strict.get("/approvals/").content.decode()
    token = html.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    post = {"csrfmiddlewaretoken": token, "call_id": "c1", "seq": seq, "verdict": "approve"}
    assert strict.post(decide_url(session), post).status_code == 302
    assert len(events(session, "approval/resolved")) == 1


def test_queue_is_bounded(reviewer: Any, session: Session, make_user: Any, profile: Any) -> None:
    from approvals_app.selectors import queue_for
    from sessions_app import services

    for i in range(3):
        s = services.create_session(make_user(f"u{i}"), profile)
        park(s.id, f"k{i}")
    park(session.id)
    rev = reviewer
    assert len(queue_for(rev)) == 4 and not queue_for(rev).truncated
    capped = queue_for(rev, session_cap=2)
    assert len(capped) == 2 and capped.truncated
    assert queue_for(rev, item_cap=3).truncated
