"""Issue 34, point 3: the chat page's files panel views, downloads and
uploads (web/files.py). An upload is an ordinary durable write (the API's
PUT verb): one version by the user, logged as document/written, held to the
profile's bounds; refused input writes nothing. Another user's session is a
404 on every view; a reviewer (view only) may read but not upload; CSRF is
enforced. The agent reads an uploaded file on its next turn."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from sessions_app import services
from sessions_app.models import Document, DocumentVersion, Event, Session
from sessions_app.runtime import documents
from sessions_app.runtime.drive import drive
from sessions_app.services import operators
from tests.fakes.fake_llm import Reply
from tests.helpers import client_for, document_text, edit_profile, events

HTMX = {"HTTP_HX_REQUEST": "true"}


def view_url(session: Session, name: str, version: int | None = None) -> str:
    url = reverse("sessions:file_view", args=[session.id, name])
    return f"{url}?version={version}" if version else url


def download_url(session: Session, name: str, version: int | None = None) -> str:
    url = reverse("sessions:file_download", args=[session.id, name])
    return f"{url}?version={version}" if version else url


def upload_url(session: Session) -> str:
    return reverse("sessions:file_upload", args=[session.id])


def a_file(name: str, data: bytes) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="application/octet-stream")


def footprint(session: Session) -> tuple[int, int, int]:
    """What a refused upload must leave as it was: events, documents, versions."""
    return (
        Event.objects.filter(session=session).count(),
        Document.objects.filter(session=session).count(),
        DocumentVersion.objects.filter(document__session=session).count(),
    )


def shown_text(html: str) -> str:
    """The <pre><code> of a file's page, as markup."""
    block = r'<div class="code-block file-view" id="file-content">.*?<pre><code>(.*?)</code></pre>'
    found = re.search(block, html, re.S)
    assert found, "the page shows the file's text"
    return found.group(1)


# ---------------------------------------------------------------- view


@pytest.mark.django_db
def test_a_files_page_shows_its_text_escaped(owner: Any, chat: Session) -> None:
    documents.write(chat.id, "notes/page.txt", b'<script>alert("x")</script> & more', by="agent")
    response = client_for(owner).get(view_url(chat, "notes/page.txt"))
    assert response.status_code == 200
    html = response.content.decode()
    assert shown_text(html) == "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more"
    assert "<script>alert" not in html
    assert "by the agent" in html and "version 1" in html
    # Its download link names this version.
    assert f'href="{download_url(chat, "notes/page.txt", 1)}"' in html


@pytest.mark.django_db
def test_a_files_page_highlights_by_extension_and_still_escapes(owner: Any, chat: Session) -> None:
    documents.write(chat.id, "tool.py", b'def f():\n    return "<b>"\n', by="agent")
    documents.write(chat.id, "page.html", b"<script>alert(1)</script>", by="agent")
    html = client_for(owner).get(view_url(chat, "tool.py")).content.decode()
    code = shown_text(html)
    assert '<span class="k">def</span>' in code  # Pygments' keyword token
    assert "&lt;b&gt;" in code and "<b>" not in code
    assert '<span class="code-lang">python</span>' in html
    page = client_for(owner).get(view_url(chat, "page.html")).content.decode()
    assert "<script>alert" not in page
    assert "&lt;" in shown_text(page)


@pytest.mark.django_db
def test_an_older_version_is_shown_with_version(owner: Any, chat: Session) -> None:
    for text in (b"first draft", b"second draft", b"third draft"):
        documents.write(chat.id, "draft.md", text, by="agent")
    client = client_for(owner)
    head = client.get(view_url(chat, "draft.md")).content.decode()
    assert "third draft" in shown_text(head)
    old = client.get(view_url(chat, "draft.md", 1)).content.decode()
    assert "first draft" in shown_text(old)
    assert "third draft" not in old
    assert "version 1" in old and "the newest is" in old
    # Every version is linked from the page.
    for v in (1, 2):
        assert f'href="{view_url(chat, "draft.md", v)}"' in head
    assert client.get(view_url(chat, "draft.md", 9)).status_code == 404
    assert client.get(view_url(chat, "draft.md") + "?version=abc").status_code == 400


@pytest.mark.django_db
def test_a_binary_or_large_file_shows_its_size_and_a_download_link(owner: Any, chat: Session) -> None:
    documents.write(chat.id, "blob.bin", b"\xff\xfe\x00\x01" * 10, by="agent")
    documents.write(chat.id, "big.txt", b"x" * (300 * 1024), by="agent")
    client = client_for(owner)
    blob = client.get(view_url(chat, "blob.bin")).content.decode()
    assert 'id="file-not-shown"' in blob and "A binary file: 40\xa0bytes" in blob
    assert f'href="{download_url(chat, "blob.bin", 1)}"' in blob
    assert "file-content" not in blob
    big = client.get(view_url(chat, "big.txt")).content.decode()
    assert "Too large to show here" in big and "x" * 1000 not in big


@pytest.mark.django_db
def test_a_file_that_does_not_exist_is_a_404(owner: Any, chat: Session) -> None:
    client = client_for(owner)
    assert client.get(view_url(chat, "nothing.txt")).status_code == 404
    assert client.get(download_url(chat, "nothing.txt")).status_code == 404
    documents.write(chat.id, "gone.txt", b"soon gone", by="agent")
    documents.retire(chat.id, "gone.txt", by="agent")
    assert client.get(view_url(chat, "gone.txt")).status_code == 404


# ---------------------------------------------------------------- download


@pytest.mark.django_db
def test_a_download_is_the_bytes_as_an_attachment(owner: Any, chat: Session) -> None:
    documents.write(chat.id, "notes/todo.txt", b"milk", by="agent")
    documents.write(chat.id, "notes/todo.txt", b"milk and bread", by="agent")
    documents.write(chat.id, "img.bin", b"\x89PNG\x00\xff", by="agent")
    client = client_for(owner)
    response = client.get(download_url(chat, "notes/todo.txt"))
    assert response.status_code == 200
    assert response.content == b"milk and bread"
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="todo.txt"'
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Security-Policy"] == "sandbox"
    assert client.get(download_url(chat, "notes/todo.txt", 1)).content == b"milk"
    binary = client.get(download_url(chat, "img.bin"))
    assert binary.content == b"\x89PNG\x00\xff"
    assert binary["Content-Type"] == "application/octet-stream"
    assert binary["Content-Disposition"] == 'attachment; filename="img.bin"'


# ---------------------------------------------------------------- upload


@pytest.mark.django_db
def test_an_upload_is_a_durable_write_by_the_user(owner: Any, chat: Session) -> None:
    client = client_for(owner)
    before = Event.objects.filter(session=chat).count()
    response = client.post(upload_url(chat), {"file": a_file("brief.txt", b"the plan: sail at dawn")})
    assert response.status_code == 302
    assert response["Location"] == reverse("sessions:chat", args=[chat.id]) + "#files"
    assert document_text(chat.id, "brief.txt") == "the plan: sail at dawn"
    (row,) = DocumentVersion.objects.filter(document__session=chat, document__name="brief.txt")
    assert (row.version, row.by, row.size) == (1, "owner", 22)
    (written,) = Event.objects.filter(session=chat, seq__gt=before)
    assert written.kind == "document/written"
    assert written.data["name"] == "brief.txt" and written.data["by"] == "owner" and written.data["version"] == 1
    # The chat page lists it with its version and writer, and says it was uploaded.
    page = client.get(reverse("sessions:chat", args=[chat.id])).content.decode()
    assert "Uploaded brief.txt: version 1" in page
    assert re.search(r"<code>brief.txt</code>.*?<td>22\xa0bytes</td><td>v1</td><td>owner</td>", page, re.S)
    # The log reads the write as a sentence (its row, by the page and its socket alike).
    row = re.search(rf'<li id="ev-{written.seq}"[^>]*class="([^"]*)".*?<div class="text">(.*?)</div>', page, re.S)
    assert row and "bookkeeping" in row.group(1)
    assert row.group(2) == "brief.txt written by owner: version 1, 22\xa0bytes."


@pytest.mark.django_db
def test_an_htmx_upload_gets_the_panel_back_and_a_second_is_the_next_version(owner: Any, chat: Session) -> None:
    client = client_for(owner)
    first = client.post(upload_url(chat), {"file": a_file("a.txt", b"one")}, **HTMX)
    assert first.status_code == 200 and "X-Terret-Error" not in first
    html = first.content.decode()
    assert html.lstrip().startswith('<section id="files"') and "<html" not in html  # the panel alone, swapped in place
    assert 'id="files-notice"' in html and "Uploaded a.txt: version 1" in html
    assert re.search(r"<code>a.txt</code>.*?<td>v1</td><td>owner</td>", html, re.S)
    # "Save as" a folder: the upload keeps its own name inside it; a second upload is version 2.
    client.post(upload_url(chat), {"file": a_file("a.txt", b"two"), "name": "notes/"}, **HTMX)
    again = client.post(upload_url(chat), {"file": a_file("other.txt", b"three"), "name": "notes/a.txt"}, **HTMX)
    assert "Uploaded notes/a.txt: version 2" in again.content.decode()
    assert document_text(chat.id, "a.txt") == "one"
    assert document_text(chat.id, "notes/a.txt") == "three"
    assert [d["version"] for d in events(chat, "document/written") if d["name"] == "notes/a.txt"] == [1, 2]


@pytest.mark.django_db
def test_an_upload_past_the_profiles_bound_is_refused_and_writes_nothing(
    owner: Any, chat: Session, profile: Any
) -> None:
    edit_profile(profile, max_document_bytes=10)
    client = client_for(owner)
    before = footprint(chat)
    response = client.post(upload_url(chat), {"file": a_file("big.txt", b"x" * 11)}, **HTMX)
    assert response.status_code == 200 and response["X-Terret-Error"] == "document_too_large"
    html = response.content.decode()
    assert 'id="files-error"' in html
    assert "Nothing uploaded: big.txt is 11 bytes; a document&#x27;s bound is 10 (max_document_bytes)" in html
    assert footprint(chat) == before
    # Without htmx: back to the chat, which says why.
    plain = client.post(upload_url(chat), {"file": a_file("big.txt", b"x" * 11)}, follow=True)
    assert "Nothing uploaded: big.txt is 11 bytes" in plain.content.decode()
    assert footprint(chat) == before
    # At the bound exactly, it is written.
    client.post(upload_url(chat), {"file": a_file("fits.txt", b"x" * 10)}, **HTMX)
    assert document_text(chat.id, "fits.txt") == "x" * 10


@pytest.mark.django_db
def test_bad_uploads_get_a_clear_error_and_write_nothing(owner: Any, chat: Session) -> None:
    client = client_for(owner)
    documents.write(chat.id, "notes", b"a file, not a folder", by="agent")
    before = footprint(chat)
    cases = [
        ({}, "invalid_input", "Nothing uploaded: This field is required."),
        ({"file": a_file("x.txt", b"hi"), "name": "../escape.txt"}, "invalid_input", "Nothing uploaded: "),
        ({"file": a_file("x.txt", b"hi"), "name": "notes/"}, "invalid_input", "a parent of the path is a file"),
    ]
    for form, code, says in cases:
        response = client.post(upload_url(chat), form, **HTMX)
        assert response.status_code == 200, form
        assert response["X-Terret-Error"] == code, form
        assert says in response.content.decode(), (form, response.content.decode())
    assert footprint(chat) == before


@pytest.mark.django_db
def test_a_revoked_session_takes_no_upload(owner: Any, chat: Session) -> None:
    operators.revoke(chat.id, by="staff", reason="test")
    before = footprint(chat)
    response = client_for(owner).post(upload_url(chat), {"file": a_file("x.txt", b"hi")}, **HTMX)
    assert response["X-Terret-Error"] == "session_revoked"
    assert "Nothing uploaded: session" in response.content.decode() and "is revoked" in response.content.decode()
    assert footprint(chat) == before


# ---------------------------------------------------------------- who may


@pytest.mark.django_db
def test_another_users_session_is_a_404_on_all_three(chat: Session, make_user: Any) -> None:
    documents.write(chat.id, "secret.txt", b"the crown jewels", by="agent")
    mallory = client_for(make_user("mallory"))
    before = footprint(chat)
    assert mallory.get(view_url(chat, "secret.txt")).status_code == 404
    assert mallory.get(download_url(chat, "secret.txt")).status_code == 404
    assert mallory.post(upload_url(chat), {"file": a_file("x.txt", b"mine now")}).status_code == 404
    assert b"crown jewels" not in mallory.get(download_url(chat, "secret.txt")).content
    assert footprint(chat) == before


@pytest.mark.django_db
def test_a_reviewer_may_read_but_not_upload(chat: Session, make_reviewer: Any) -> None:
    documents.write(chat.id, "notes.txt", b"read me", by="agent")
    reviewer = client_for(make_reviewer("rita"))
    assert "read me" in reviewer.get(view_url(chat, "notes.txt")).content.decode()
    assert reviewer.get(download_url(chat, "notes.txt")).content == b"read me"
    before = footprint(chat)
    assert reviewer.post(upload_url(chat), {"file": a_file("x.txt", b"hi")}).status_code == 403
    assert footprint(chat) == before
    # The panel offers no upload form to whom may not drive.
    page = reviewer.get(reverse("sessions:chat", args=[chat.id])).content.decode()
    assert 'id="files-table"' in page and 'id="upload-form"' not in page


@pytest.mark.django_db
def test_the_anonymous_are_sent_to_sign_in(chat: Session) -> None:
    documents.write(chat.id, "notes.txt", b"read me", by="agent")
    before = footprint(chat)
    for response in (
        Client().get(view_url(chat, "notes.txt")),
        Client().get(download_url(chat, "notes.txt")),
        Client().post(upload_url(chat), {"file": a_file("x.txt", b"hi")}),
    ):
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert footprint(chat) == before


@pytest.mark.django_db
def test_an_upload_needs_the_csrf_token(owner: Any, chat: Session) -> None:
    client = client_for(owner, enforce_csrf_checks=True)
    before = footprint(chat)
    refused = client.post(upload_url(chat), {"file": a_file("x.txt", b"forged")})
    assert refused.status_code == 403
    assert footprint(chat) == before
    # The page's own form carries the token, and with it the upload is taken.
    page = client.get(reverse("sessions:chat", args=[chat.id])).content.decode()
    form = re.search(r'<form [^>]*id="upload-form".*?</form>', page, re.S)
    assert form
    assert 'enctype="multipart/form-data"' in form.group(0) and 'hx-encoding="multipart/form-data"' in form.group(0)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.group(0))
    assert token
    taken = client.post(upload_url(chat), {"file": a_file("x.txt", b"real"), "csrfmiddlewaretoken": token.group(1)})
    assert taken.status_code == 302
    assert document_text(chat.id, "x.txt") == "real"


# ---------------------------------------------------------------- the agent sees it


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("manual_worker")
def test_the_agent_reads_an_uploaded_file_on_its_next_turn(fake_llm: Any, owner: Any, session: Session) -> None:
    uploaded = "Harbour master's note: the tide turns at 14:05."
    response = client_for(owner).post(upload_url(session), {"file": a_file("tide.txt", uploaded.encode())})
    assert response.status_code == 302
    fake_llm.script(
        Reply(tool_calls=[("workspace.read", {"path": "tide.txt"})]), Reply(text="The tide turns at 14:05.")
    )
    services.run_turn(session.id, "read tide.txt")
    assert drive(session.id) == "ended"
    (result,) = events(session, "tool/result")
    assert result["name"] == "workspace.read" and not result["is_error"]
    assert uploaded in result["content"]
    # The model's second request carried the file's text, as the tool's result.
    assert len(fake_llm.requests) == 2
    sent = fake_llm.requests[-1]["messages"]
    tool_messages = [m for m in sent if m["role"] == "tool"]
    assert tool_messages and uploaded in json.dumps(tool_messages[-1]["content"], ensure_ascii=False)
    assert [e["status"] for e in events(session, "turn/end")] == ["completed"]


@pytest.mark.django_db
def test_the_page_socket_swaps_the_files_count_and_list_when_a_document_moves(owner: Any, chat: Session) -> None:
    from sessions_app.log.reads import event_frames
    from sessions_app.web.present import ChatFollower

    follower = ChatFollower(chat.id, owner)
    after = Session.objects.get(id=chat.id).last_seq
    documents.write(chat.id, "notes/plan.md", b"# Plan", by="agent")
    fragments = [f.html for f in follower.events(event_frames(chat.id, after))]
    (listing,) = [h for h in fragments if 'id="files-list"' in h]
    (count,) = [h for h in fragments if 'id="files-count"' in h]
    assert 'hx-swap-oob="true"' in listing and "notes/plan.md" in listing and "the agent" in listing
    assert 'hx-swap-oob="true"' in count and '<span class="badge">1</span>' in count

    after = Session.objects.get(id=chat.id).last_seq
    documents.retire(chat.id, "notes/plan.md", by="agent")
    fragments = [f.html for f in follower.events(event_frames(chat.id, after))]
    (listing,) = [h for h in fragments if 'id="files-list"' in h]
    assert "notes/plan.md" not in listing and "No files yet" in listing

    # Events that move no document leave the panel alone.
    after = Session.objects.get(id=chat.id).last_seq
    services.inject(chat.id, "hello")
    assert not [f for f in follower.events(event_frames(chat.id, after)) if 'id="files-list"' in f.html]


@pytest.mark.django_db
def test_a_follower_whose_access_ended_gets_no_files_fragment(owner: Any, make_user: Any, chat: Session) -> None:
    from sessions_app.log.reads import event_frames
    from sessions_app.web.present import ChatFollower, files_fragment

    stranger = make_user("stranger")
    assert files_fragment(chat, stranger) == ""  # a second user sees nothing of the first's files
    follower = ChatFollower(chat.id, stranger)
    after = Session.objects.get(id=chat.id).last_seq
    documents.write(chat.id, "secret.txt", b"for the owner only", by="agent")
    # The socket refuses such a user (4403) before any follower reads; one whose access ends
    # mid-stream gets no panel swap from the batch that is already under way.
    assert not [f for f in follower.events(event_frames(chat.id, after)) if 'id="files-list"' in f.html]
